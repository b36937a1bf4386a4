"""A user's script under kube-ddp's torchrun (`ddp_trainer.script`): run as python runs it, and
ended without the interpreter's teardown, in which a rank that trained to its end can abort."""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
from pathlib import Path

from torch.distributed.run import parse_args

from ddp_trainer import script as runner
from ddp_trainer import torchrun
from kube_ddp.local.plan import free_port
from tests.trainer import support

# What a plain script sees of itself, and what its end must still do: an atexit handler, a
# non-daemon thread that writes after the script's last line, a file it never closed.
SEEN = """
    import atexit, os, sys, threading, time
    print("name", __name__)
    print("file", os.path.realpath(__file__))
    print("argv", sys.argv)
    print("path0", sys.path[0])
    import beside  # a module in the script's folder, as python finds it
    atexit.register(print, "atexit ran")
    left_open = open(sys.argv[1], "w")
    left_open.write("written, never closed")
    def late():
        time.sleep(0.3)
        print("thread ended", flush=True)
    threading.Thread(target=late).start()
    sys.exit(int(sys.argv[2]))
"""

# A rank that ends while gloo's thread runs a callback of its last collective, which needs the
# GIL: in python's own teardown this aborts (exit 134 or "Fatal Python error") in about one run
# of three here.
GLOO_AT_EXIT = """
    import time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(1)
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    work.get_future().then(lambda done: done.value())
    print("rank", dist.get_rank(), "done", flush=True)
"""
ABORTS = ("terminate called", "Fatal Python error")
# The same two ranks started by the script itself with mp.spawn: under python, mp.spawn then
# raises for the rank that aborted (about one run in two here).
SPAWNS_GLOO_AT_EXIT = """
    import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
    def rank(i, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=i, world_size=2)
        if i == 1:
            time.sleep(1)
        work = dist.all_reduce(torch.ones(1000), async_op=True)
        work.get_future().then(lambda done: done.value())
        print("rank", i, "done", flush=True)
    if __name__ == "__main__":
        mp.spawn(rank, args=(sys.argv[1],), nprocs=2)
"""


def write_script(folder: Path, body: str) -> Path:
    script = folder / "train.py"
    script.write_text(textwrap.dedent(body))
    return script


def test_a_script_sees_itself_and_ends_as_under_python(tmp_path: Path) -> None:
    """The same script, by python and by the runner: the same lines, exit code and file."""
    script = write_script(tmp_path, SEEN)
    (tmp_path / "beside.py").write_text("")
    ran = {}
    for how, prefix in (("python", []), ("runner", ["-m", torchrun.SCRIPT_RUNNER])):
        written = tmp_path / f"{how}.txt"
        done = support.run([sys.executable, *prefix, str(script), str(written), "3"], cwd=Path("/"))
        assert done.returncode == 3, done.stderr
        assert written.read_text() == "written, never closed"
        ran[how] = done.stdout.replace(str(written), "<file>")
    assert ran["runner"] == ran["python"]
    assert "name __main__" in ran["runner"]
    assert f"path0 {tmp_path}" in ran["runner"]
    assert ran["runner"].endswith("thread ended\natexit ran\n")


def test_a_scripts_error_is_said_from_its_own_frame_and_exits_1(tmp_path: Path) -> None:
    script = write_script(tmp_path, "def train():\n    raise ValueError('bad batch')\ntrain()\n")
    done = support.run([sys.executable, "-m", torchrun.SCRIPT_RUNNER, str(script)])
    assert done.returncode == 1
    traceback = done.stderr.split("Traceback (most recent call last):\n", 1)[1].splitlines()
    assert traceback[0] == f'  File "{script}", line 3, in <module>', done.stderr
    assert traceback[-1] == "ValueError: bad batch"
    assert "runpy" not in done.stderr


def test_a_missing_script_exits_2_as_under_python(tmp_path: Path) -> None:
    done = support.run([sys.executable, "-m", torchrun.SCRIPT_RUNNER, str(tmp_path / "no.py")])
    assert done.returncode == 2
    assert "can't open file" in done.stderr


def test_only_a_script_run_by_this_python_is_run_under_the_runner() -> None:
    """torchrun's arguments (pinned to its parser): a script is; a module, a program, a run in
    torchrun's own process and another interpreter (PYTHON_EXEC) are left as they were."""
    args = parse_args(["--nproc-per-node=2", "train.py", "--lr", "0.1"])  # type: ignore[no-untyped-call]
    torchrun.run_script_ended_cleanly(args, {})
    assert (args.module, args.training_script) == (True, torchrun.SCRIPT_RUNNER)
    assert args.training_script_args == ["train.py", "--lr", "0.1"]
    for left in (["-m", "ddp_trainer"], ["--no-python", "./train.sh"], ["--run-path", "train.py"]):
        args = parse_args(left)  # type: ignore[no-untyped-call]
        torchrun.run_script_ended_cleanly(args, {})
        assert args.training_script == left[1], left
    args = parse_args(["train.py"])  # type: ignore[no-untyped-call]
    torchrun.run_script_ended_cleanly(args, {"PYTHON_EXEC": "/opt/python3"})
    assert (args.module, args.training_script) == (False, "train.py")


def test_ranks_that_end_with_gloo_busy_exit_0_under_the_pods_torchrun(tmp_path: Path) -> None:
    """Four runs of two ranks whose last collective's callback is still running at their end:
    each exits 0 (under torch's own torchrun, about one in three aborts here)."""
    script = write_script(tmp_path, GLOO_AT_EXIT)
    for run in range(4):
        done = support.run(support.wrapped_torchrun_command(str(script)))
        said = done.stdout + done.stderr
        assert done.returncode == 0 and not any(abort in said for abort in ABORTS), (run, said)
        assert sorted(done.stdout.split("\n")[:2]) == ["rank 0 done", "rank 1 done"]


def test_ranks_mp_spawn_starts_with_gloo_busy_exit_0_under_the_runner(tmp_path: Path) -> None:
    script = write_script(tmp_path, SPAWNS_GLOO_AT_EXIT)
    for run in range(6):  # each aborts about one in two without the runner
        port = str(free_port())
        done = support.run([sys.executable, "-m", torchrun.SCRIPT_RUNNER, str(script), port])
        said = done.stdout + done.stderr
        assert done.returncode == 0 and not any(abort in said for abort in ABORTS), (run, said)
        assert sorted(done.stdout.split("\n")[:2]) == ["rank 0 done", "rank 1 done"]


def test_mp_spawns_target_has_what_the_runner_passes_on() -> None:
    """torch's private target of mp.spawn, pinned: the runner replaces it only where it fits."""
    # by its module's name: torch.multiprocessing's attribute `spawn` is the function
    target = getattr(importlib.import_module(runner.SPAWN_MODULE), runner.SPAWN_TARGET)
    assert tuple(inspect.signature(target).parameters) == runner.SPAWN_PARAMETERS
