"""A rank's own end under torchrun, for real: `python -m ddp_trainer.torchrun` (what kube-ddp runs
in front of its ranks) exits as the rank that failed first did, where torchrun itself exits 1."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddp_trainer.contract import EXIT_PEER_LOST, EXIT_TEMPORARY
from tests.trainer import support

# Rank 1 ends as argv[1] says once the group is up; rank 0 waits until torchrun stops it (not in
# a collective: gloo's would fail at once with its own exit 1, which is then a second failure).
SCRIPT = """\
import os, signal, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    how = sys.argv[1]
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "raise":
        raise ValueError("a bug in the program")
    os._exit(int(how))
time.sleep(600)
"""


def wrapped_torchrun(script: Path, how: str) -> list[str]:
    return support.wrapped_torchrun_command(str(script), how)


@pytest.mark.parametrize(
    ("how", "code", "said"),
    [
        ("kill", 137, "rank 1 was killed by SIGKILL first: exiting 137"),
        ("raise", 1, "rank 1 exited with code 1 first: exiting 1"),
        (str(EXIT_PEER_LOST), EXIT_PEER_LOST, f"exiting {EXIT_PEER_LOST}"),
        (str(EXIT_TEMPORARY), EXIT_TEMPORARY, f"exiting {EXIT_TEMPORARY}"),
    ],
)
def test_the_pod_exits_as_its_failed_rank_did(
    tmp_path: Path, how: str, code: int, said: str
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    run = support.run(wrapped_torchrun(script, how))
    assert run.returncode == code, run.stderr[-3000:]
    assert run.stderr.rstrip().endswith(said)  # the last line: the pod's failure message
    # each failed rank in a line, not torchrun's long summary: the log's tail stays the ranks'
    assert "ddp_trainer.torchrun: rank 1 (local rank 1, pid " in run.stderr
    assert "Root Cause (first observed failure)" not in run.stderr
    if how == "raise":
        assert "ValueError: a bug in the program" in run.stderr


def test_a_run_that_succeeds_exits_0(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    assert support.run(wrapped_torchrun(script, "unused")).returncode == 0


# The trainer's own entry point, with an exit handler that says whether the interpreter tore
# itself down.
TEARDOWN_PROBE = """\
import atexit, runpy, sys
atexit.register(print, "torn down")
sys.argv[0] = "ddp_trainer"
runpy.run_module("ddp_trainer", run_name="__main__")
"""


def test_a_finished_rank_ends_without_teardown_and_with_its_output_whole(tmp_path: Path) -> None:
    """Gloo's threads outlive the process group; one that releases a finished collective's
    tensors while the interpreter finalizes aborts the process (134 for a rank that finished:
    the CI's MNIST example restarted in place once). So the trainer skips the teardown and
    flushes its output (a pipe's, buffered) first."""
    run = support.run(
        [
            sys.executable,
            "-c",
            TEARDOWN_PROBE,
            "--dataset=digits",
            f"--data-dir={tmp_path}",
            "--epochs=1",
            f"--summary-file={tmp_path / 'summary.json'}",
        ]
    ).check()
    assert "torn down" not in run.stdout
    assert len(run.epochs) == 1  # stdout's last lines were flushed
    assert "done: 1 epochs" in run.stderr
    assert support.summary(tmp_path / "summary.json")["epochs_run"] == 1
