"""A world of one steps the bare model: no process group, no DDP, and still every report a group
gets (progress, checkpoints, a stall), under the pods' own command."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kube_ddp.local.plan import free_port
from tests.trainer import support
from tests.trainer.support import FakeApiServer

# Runs the trainer as `python -m ddp_trainer` does, saying after setup what it built.
PROBE = """
import sys
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from ddp_trainer import __main__, train

setup = train.Recipe.setup

def said_after_setup(recipe):
    setup(recipe)
    print(
        f"probe rank={recipe.world.rank} group={dist.is_initialized()} "
        f"ddp={isinstance(recipe.step_model, DistributedDataParallel)} "
        f"ledger={recipe.ledger is not None}",
        flush=True,
    )

train.Recipe.setup = said_after_setup
sys.exit(__main__.main(sys.argv[1:]))
"""

DIGITS = ["--dataset=digits", "--batch-size=32", "--timeout-seconds=60", "--lr=0.05"]


@pytest.mark.parametrize(
    ("nproc", "built"),
    [(1, "group=False ddp=False ledger=True"), (2, "group=True ddp=True ledger=True")],
)
def test_a_world_of_one_builds_no_group_nor_ddp_and_reports_all_a_group_does(
    tmp_path: Path, api_server: FakeApiServer, token_file: Path, nproc: int, built: str
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    checkpoints = tmp_path / "ck"
    trainer = [str(probe), *DIGITS, "--model=mlp", "--epochs=2", f"--checkpoint-dir={checkpoints}"]
    command = support.agent_command(*trainer, port=free_port(), nnodes="1", host=True, nproc=nproc)
    env = support.agent_env("mnist-worker-0", api_server, token_file)
    run = support.run(command, env).check()
    said = [line for line in run.stdout.splitlines() if line.startswith("probe rank=0 ")]
    assert said and built in said[0], run.stdout[-2000:]
    backend = "none" if nproc == 1 else "gloo"
    assert f"world_size={nproc} local_rank=0" in run.stderr
    assert f"launcher=torchrun backend={backend} device=cpu" in run.stderr

    reported = support.patches_of(api_server, "training")
    ends = [report for report in reported if report.get("progressPercentage") == 100]
    assert ends and ends[-1]["epoch"] == 2 and ends[-1]["worldSize"] == nproc, reported
    saved = [report["checkpoint"] for report in reported if report.get("checkpoint")]
    assert saved and saved[-1]["epoch"] == 2, reported
    assert any(checkpoints.glob("checkpoint-step-*.pt"))

    again = support.run(command, {**env, "KUBEDDP_ATTEMPT": "1"}).check()
    assert "resuming at step" in again.stderr, again.stderr[-2000:]


def test_a_hung_world_of_one_says_its_stall_on_the_job(
    api_server: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    """The operator's pod of one process (RANK=0, WORLD_SIZE=1) hangs in its own code after
    epoch 1: its ledger, in a store of its own, logs where it is and reports the stall."""
    env = support.agent_env(
        "mnist-worker-0",
        api_server,
        token_file,
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        KUBEDDP_HEARTBEAT_SECONDS="1",
        DDP_TRAINER_HANG_AT_EPOCH="1",
    )
    args = ["--dataset=synthetic", "--epochs=50", "--timeout-seconds=10"]
    process = support.start([sys.executable, "-m", "ddp_trainer", *args], env)
    assert process.stderr is not None
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(iter(process.stderr.readline, "")))
    reader.start()
    deadline = time.monotonic() + support.RUN_TIMEOUT_S
    try:  # the stall is said within the heartbeat's interval, the stack logged within 8 s
        while not (stalls_of(api_server) and any("in hang_if_asked" in line for line in stderr)):
            assert process.poll() is None and time.monotonic() < deadline, "".join(stderr)
            time.sleep(0.2)
    finally:
        process.kill()  # hung for good
        process.wait()
        reader.join()
    assert any("no step for" in line for line in stderr)
    stalls = stalls_of(api_server)
    assert stalls
    stall = stalls[0]
    assert (stall["rank"], stall["pod"], stall["node"]) == (0, "mnist-worker-0", "node-a"), stall
    assert stall["step"] > 0  # after epoch 1
    assert "the job's only rank, in its own code" in stall["message"], stall


def stalls_of(api_server: FakeApiServer) -> list[dict[str, Any]]:
    return [t["stall"] for t in support.patches_of(api_server, "training") if t.get("stall")]
