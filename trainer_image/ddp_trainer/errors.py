"""The failures the trainer expects, each shown as one line without a traceback, and the exit
code that tells the operator whether a restart can help (docs/design.md, "Failure rules").

- `TrainerError` (exit 1): the job's data, model or checkpoint is wrong; restarting will not
  help.
- `StorageError` (exit `contract.EXIT_CONFIG`, 78, sysexits' EX_CONFIG): a path the job
  names cannot be used (permission denied, read-only, full disk, missing): a configuration
  error in the job's volumes or paths; restarting will not help either, so it is not
  retryable, but the line says what to change.
- `TemporaryError` (exit `contract.EXIT_TEMPORARY`, 75, EX_TEMPFAIL): a download failed;
  the operator restarts the group for it (the network may be back).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

from ddp_trainer import contract


class TrainerError(Exception):
    """Bad data, environment or model: `python -m ddp_trainer` prints the message and exits."""

    exit_code: int = contract.EXIT_FAILED


class ConfigError(TrainerError):
    """The job's settings do not fit its pod: the message names the setting and the fix."""

    exit_code = contract.EXIT_CONFIG


class StorageError(ConfigError):
    """A path the job names cannot be read or written: fix the job's volumes or paths."""


class TemporaryError(TrainerError):
    """A failure a later attempt may not meet (a download): the operator retries it."""

    exit_code = contract.EXIT_TEMPORARY


def _who() -> str:
    return f"uid {os.getuid()}, gid {os.getgid()}" if hasattr(os, "getuid") else "this user"


_FIXES = {
    errno.EACCES: "permission denied for {who}: mount a volume there the user can write "
    f"(kube-ddp gives a dataDir or checkpointDir without a volume an emptyDir, and the pod "
    f"fsGroup {contract.IMAGE_GID}) or choose a writable path",
    errno.EROFS: "read-only file system: mount a writable volume there or choose another path",
    errno.ENOSPC: "no space left on the device: give the volume more space (an emptyDir's "
    "sizeLimit, a larger PersistentVolumeClaim), keep fewer checkpoints (keepCheckpoints) "
    "or choose another path",
    errno.ENOENT: "no such file or directory: mount it, or check the path",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
}
_FIXES[errno.EPERM] = _FIXES[errno.EACCES]
_FIXES[errno.EDQUOT] = _FIXES[errno.ENOSPC]


def storage_error(exc: OSError, doing: str = "") -> StorageError:
    """An OSError met on a path, as one line: the path, what went wrong and the fix."""
    path = exc.filename if exc.filename is not None else "a file"
    fix = _FIXES.get(exc.errno or 0)
    what = fix.format(who=_who()) if fix else (exc.strerror or str(exc))
    return StorageError(f"{doing or 'cannot use'} {path}: {what}")


@contextlib.contextmanager
def storage(path: object, doing: str) -> Iterator[None]:
    """Run the block; an OSError it meets becomes a `StorageError` naming `path` (or the file
    the error names, when it names one)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise storage_error(exc, doing) from None


# --- a collective that timed out or a peer that went away: not this program's bug ----------
# torch.distributed's own error kinds, and what gloo raises as a plain RuntimeError (read from
# torch 2.15: "Timed out waiting 3000ms for recv operation to complete", "Connection closed by
# peer", both from third_party/gloo/gloo/transport/tcp).
DISTRIBUTED_ERRORS = frozenset({"DistError", "DistBackendError", "DistNetworkError"})
LOST_PEER_MARKERS = ("gloo/transport/", "Connection closed by peer", "Connection reset by peer")


def is_peer_lost(exc: BaseException) -> bool:
    """Whether `exc` says a collective timed out or another rank went away."""
    if any(kind.__name__ in DISTRIBUTED_ERRORS for kind in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in LOST_PEER_MARKERS)


def exit_peer_lost(prog: str, exc: BaseException) -> NoReturn:
    """End this process with `contract.EXIT_PEER_LOST`, saying why in the last line."""
    print(
        f"{prog}: error: {exc}\n{prog}: a collective timed out or a peer went away: "
        f"exiting {contract.EXIT_PEER_LOST} so that the group restarts",
        file=sys.stderr,
        flush=True,
    )
    end_process(contract.EXIT_PEER_LOST)


# What must be written out before `end_process` exits, called with the exit code: registered
# by the modules above this one (`tracking` closes the training curves still open).
_BEFORE_EXIT: list[Callable[[int], None]] = []


def before_exit(hook: Callable[[int], None]) -> None:
    """Have `end_process` call `hook(code)` before the process ends (once per hook)."""
    if hook not in _BEFORE_EXIT:
        _BEFORE_EXIT.append(hook)


def end_process(code: int) -> NoReturn:
    """Exit with `code`; once torch is loaded, without the interpreter's teardown. Gloo's worker
    threads outlive destroy_process_group, and one that drops the last reference to a finished
    collective's tensors while the interpreter finalizes takes a GIL that is gone: std::terminate,
    and SIGABRT's 134 in place of `code` (a finished rank then looks failed). Training curves
    still open are written out first (`before_exit`)."""
    for hook in list(_BEFORE_EXIT):
        hook(code)
    if "torch" not in sys.modules:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
