"""A user's script run as `python script.py` runs it, ended without the interpreter's teardown:
`python -m ddp_trainer.script <script> [args]`, what kube-ddp's torchrun starts for each rank
of a job whose command names a script (`torchrun.run_script_ended_cleanly`).

A rank that ends while a thread of torch (gloo's) still holds Python objects can abort in the
interpreter's teardown: the thread takes a GIL that is gone, and CPython before 3.14 ends it
through C++ frames that may not throw (`terminate called without an active exception`, or
"Fatal Python error"): SIGABRT's 134 after a run that trained to its end, and the job restarts
or fails for nothing. Here the script's end is Python's up to that teardown: its non-daemon
threads joined, its atexit handlers run (logging's, multiprocessing's, weakref.finalize's),
every file still open flushed, then the process exits with the script's exit code, as
`errors.end_process` ends kube-ddp's own trainer. What the teardown alone would do, an object's
`__del__` at exit, does not run. The ranks a script starts itself with torch's `mp.spawn` end
so too: once the script imports torch, the target each spawned process runs
(`torch.multiprocessing.spawn._wrap`, private: its signature is checked before it is replaced,
and pinned by tests/trainer/test_script.py) ends its process the same way.
Standard library only: it runs in any image that has this package.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.abc
import importlib.util
import inspect
import io
import os
import runpy
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType, TracebackType
from typing import Any, NoReturn

# What holds written bytes until flushed (a raw FileIO writes at once).
BUFFERED = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
EXIT_USAGE = 2  # what python exits with when it cannot open the script
# torch's module whose `_wrap(fn, i, args, error_file)` each process of mp.spawn runs.
SPAWN_MODULE = "torch.multiprocessing.spawn"
SPAWN_TARGET = "_wrap"
SPAWN_PARAMETERS = ("fn", "i", "args", "error_file")
_REPLACED: dict[str, Callable[..., None]] = {}  # torch's own target, once replaced here


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or not os.path.isfile(argv[0]):
        named = argv[0] if argv else ""
        print(f"{sys.executable}: can't open file {named!r}: no such file", file=sys.stderr)
        end(EXIT_USAGE)
    end(run(argv[0], argv[1:]))


def run(script: str, args: Sequence[str]) -> int:
    """Run `script` as __main__ with `args`, as `python script args` would; its exit code."""
    sys.argv[:] = [script, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    sys.meta_path.insert(0, _SpawnedRanksEndCleanly())
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exit_code(exc.code)
    except Exception as exc:  # said as python says it, then exit 1
        trimmed = _from_script(exc.__traceback__, script)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        return 1
    return 0


def exit_code(code: object) -> int:
    """What python exits with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _from_script(tb: TracebackType | None, script: str) -> TracebackType | None:
    """The traceback from the script's own frame on: this module's and runpy's are ours."""
    name = os.fsdecode(script)
    at = tb
    while at is not None and at.tb_frame.f_code.co_filename != name:
        at = at.tb_next
    return at if at is not None else tb


class _SpawnedRanksEndCleanly(importlib.abc.MetaPathFinder):
    """Once torch's spawn module is imported, its processes' target is `spawned_rank`."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != SPAWN_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_replace(module: ModuleType) -> None:
            exec_module(module)
            replace_spawn_target(module)

        loader.exec_module = exec_then_replace
        return spec


def replace_spawn_target(module: ModuleType) -> bool:
    """Have each process `module` (torch's spawn) starts run `spawned_rank`, where its target
    has the parameters this passes on; whether it did."""
    original = getattr(module, SPAWN_TARGET, None)
    try:
        parameters = tuple(inspect.signature(original).parameters) if original else ()
    except (TypeError, ValueError):
        parameters = ()
    if original is None or parameters != SPAWN_PARAMETERS:
        return False
    _REPLACED[SPAWN_TARGET] = original
    setattr(module, SPAWN_TARGET, spawned_rank)
    return True


def spawned_rank(fn: Callable[..., None], i: int, args: tuple[Any, ...], error_file: str) -> None:
    """A process of mp.spawn: torch's target, then this process ended as `end` ends it."""
    # a spawned process imported torch afresh (its target is torch's); a forked one has this
    original = _REPLACED.get(SPAWN_TARGET) or getattr(
        importlib.import_module(SPAWN_MODULE), SPAWN_TARGET
    )
    try:
        original(fn, i, args, error_file)
    except SystemExit as exc:
        end(exit_code(exc.code))
    end(0)


def end(code: int) -> NoReturn:
    """Python's exit up to its teardown, then exit `code`."""
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # a file the script left open is flushed as teardown would
        if issubclass(type(obj), BUFFERED):  # not isinstance: it reads __class__, which warns
            with contextlib.suppress(OSError, ValueError):  # closed under it, or a broken pipe
                if not obj.closed:
                    obj.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # None when detached
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # the module by its name, whose functions a spawned process finds
    importlib.import_module("ddp_trainer.script").main()
