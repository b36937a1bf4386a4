"""Checkpoints by step and SIGTERM, for real: 2 gloo processes under torchrun (and under
`python -m ddp_trainer.torchrun`, what kube-ddp runs in front of its ranks), on the digits.

Each rank logs a digest of every batch it trains on (DDP_TRAINER_BATCH_LOG), so a resumed run
can be compared with an uninterrupted one batch by batch."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from ddp_trainer.contract import EXIT_PREEMPTED
from kube_ddp.local.plan import free_port
from tests.trainer import support

DIGITS = ["--dataset=digits", "--batch-size=32", "--timeout-seconds=60", "--lr=0.05"]
STEPS_PER_EPOCH = 23  # 1437 training digits, 719 a rank, 32 a batch


def batch_log(prefix: Path, rank: int) -> list[dict[str, Any]]:
    path = Path(f"{prefix}.rank{rank}")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for_steps(prefix: Path, steps: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + support.RUN_TIMEOUT_S
    while len(batch_log(prefix, 0)) < steps:
        assert process.poll() is None, "the run ended before it was stopped"
        assert time.monotonic() < deadline, "no training steps"
        time.sleep(0.2)


def test_a_run_resumed_from_a_step_checkpoint_trains_on_the_same_batches(tmp_path: Path) -> None:
    """Rank 1 is killed after global step 33 (epoch 2, step 10 of it); the step checkpoint of
    step 30 is the newest; the resumed run's first batches, on both ranks, are those the
    uninterrupted run trained on at step 31, with the same loss."""
    common = [*DIGITS, "--epochs=2", "--checkpoint-every-steps=10"]
    checkpoints = tmp_path / "checkpoints"
    whole_log, cut_log = tmp_path / "whole", tmp_path / "cut"
    crash = {
        "DDP_TRAINER_CRASH_ONCE_AT_STEP": "33",
        "DDP_TRAINER_CRASH_MARKER": str(tmp_path / "crashed"),
    }
    uninterrupted = support.start(
        support.torchrun_command(*common), support.clean_env(DDP_TRAINER_BATCH_LOG=str(whole_log))
    )
    crashed = support.start(
        support.torchrun_command(*common, f"--checkpoint-dir={checkpoints}"),
        support.clean_env(DDP_TRAINER_BATCH_LOG=str(cut_log), **crash),
    )
    whole_run = support.finish(uninterrupted).check()
    assert support.finish(crashed).returncode != 0
    assert batch_log(cut_log, 1)[-1]["step"] == 33
    resumed_log = tmp_path / "resumed"
    resumed = support.run(
        support.torchrun_command(*common, f"--checkpoint-dir={checkpoints}"),
        support.clean_env(DDP_TRAINER_BATCH_LOG=str(resumed_log), **crash),
    ).check()
    assert "resuming at step 30 (epoch 2, step 7 of it)" in resumed.stderr
    for rank in (0, 1):
        whole = {line["step"]: line for line in batch_log(whole_log, rank)}
        after = batch_log(resumed_log, rank)
        assert [line["step"] for line in after] == list(range(31, 2 * STEPS_PER_EPOCH + 1))
        assert after[0] == whole[31]  # the same batch, and the same loss on it
        assert after[-1]["loss"] == whole[2 * STEPS_PER_EPOCH]["loss"]
    # The epoch's sums carried across the resume: the same epoch line as never stopping.
    assert resumed.epochs[-1] | {"epoch_time": 0, "images_per_sec": 0} == whole_run.epochs[-1] | {
        "epoch_time": 0,
        "images_per_sec": 0,
    }


def test_sigterm_saves_at_a_step_both_ranks_agree_on_and_the_pod_exits_86(
    tmp_path: Path,
) -> None:
    """SIGTERM to kube-ddp's torchrun, as the kubelet sends it to a pod's first process: it
    passes it on, both ranks stop after the same step, rank 0 saves that step, every process
    exits 86."""
    checkpoints, log = tmp_path / "checkpoints", tmp_path / "batches"
    command = support.wrapped_torchrun_command(
        "-m", "ddp_trainer", *DIGITS, "--epochs=300", f"--checkpoint-dir={checkpoints}"
    )
    process = support.start(command, support.clean_env(DDP_TRAINER_BATCH_LOG=str(log)))
    wait_for_steps(log, 30, process)
    process.send_signal(signal.SIGTERM)
    run = support.finish(process)
    assert run.returncode == EXIT_PREEMPTED, run.stderr[-3000:]
    assert "every local rank exited 86 (preempted, saved): exiting 86" in run.stderr
    step = batch_log(log, 0)[-1]["step"]
    assert batch_log(log, 1)[-1]["step"] == step  # both stopped after the same step
    assert f"stopped on SIGTERM after step {step}, checkpoint saved at step {step}" in run.stderr
    newest = sorted(checkpoints.glob("checkpoint-step-*.pt"))[-1]
    assert newest.name == f"checkpoint-step-{step:010d}.pt"
    state = torch.load(newest, weights_only=True)
    assert state["step"] == step
    assert state["in_epoch"]["step"] == step - state["epoch"] * STEPS_PER_EPOCH


def test_sigterm_before_the_process_group_exists_exits_86_without_saving(
    tmp_path: Path,
) -> None:
    """Rank 0 of 2 waits in the rendezvous for a rank 1 that never comes: in C++, where
    Python's signal handlers do not run."""
    env = support.clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    env["MASTER_PORT"] = str(free_port())
    checkpoints = tmp_path / "checkpoints"
    process = support.start(
        support.trainer_command(*DIGITS, f"--checkpoint-dir={checkpoints}"), env
    )
    assert process.stderr is not None
    for line in process.stderr:  # its first line: the rendezvous is next
        if "world_size=2" in line:
            break
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    run = support.finish(process)
    assert run.returncode == EXIT_PREEMPTED, run.stderr[-2000:]
    assert "SIGTERM before training started" in run.stderr
    assert not checkpoints.exists()


# A rank whose training is over: its group destroyed, then SIGTERM, as a finished job's last
# workers are stopped.
AFTER_THE_GROUP = """
import os, signal, time
from ddp_trainer.preemption import Preemption
preemption = Preemption()
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
preemption.stop_requested()
dist.destroy_process_group()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(1)
print("ended as it ended")
"""


def test_sigterm_after_the_group_is_gone_leaves_the_exit_code_alone() -> None:
    env = support.clean_env(WORLD_SIZE="2")  # one of several ranks, as the job says
    code = AFTER_THE_GROUP.format(port=free_port())
    run = support.run([str(support.VENV_BIN / "python"), "-c", code], env).check()
    assert "ended as it ended" in run.stdout


OWN_SCRIPT = support.REPO / "manifests" / "examples" / "own-script" / "train.py"


def test_a_plain_pytorch_script_with_the_helper_saves_and_exits_86(tmp_path: Path) -> None:
    """The own-script example (plain PyTorch and `ddp_trainer.preemption`) under kube-ddp's
    torchrun, 2 processes: SIGTERM mid-run, both ranks stop after the same step, rank 0's
    checkpoint holds it, the pod exits 86; run again, it resumes after that step."""
    checkpoints = tmp_path / "checkpoints"
    command = support.wrapped_torchrun_command(
        str(OWN_SCRIPT), "--epochs=10000", f"--checkpoint-dir={checkpoints}"
    )
    process = support.start(command, support.clean_env())
    support.wait_for_output(process, "rank 0 of 2")
    time.sleep(2)
    process.send_signal(signal.SIGTERM)
    run = support.finish(process)
    assert run.returncode == EXIT_PREEMPTED, run.stdout[-2000:] + run.stderr[-2000:]
    said = re.findall(r"stopping after step (\d+)", run.stdout)
    assert len(said) == 2 and said[0] == said[1], run.stdout[-2000:]  # one step, both ranks
    step = int(said[0])
    state = torch.load(checkpoints / "checkpoint.pt", weights_only=True)
    assert state["step"] == step

    again = support.start(command, support.clean_env())
    resuming = support.wait_for_output(again, r"rank 0 resuming after step (\d+)\n")
    again.send_signal(signal.SIGTERM)
    resumed = support.finish(again)
    assert resumed.returncode == EXIT_PREEMPTED, resumed.stderr[-2000:]
    assert int(resuming[1]) == step
