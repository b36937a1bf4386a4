"""Whole runs: torchrun, mpirun-style and plain processes training to a target, crashing,
resuming, and failing clearly."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from ddp_trainer.contract import EXIT_CONFIG, EXIT_PEER_LOST
from kube_ddp.local.plan import free_port
from tests.trainer import support
from tests.trainer.support import Run

FAST = ["--timeout-seconds", "60", "--batch-size", "32", "--lr", "0.05"]
MNIST_RUN = ["--dataset", "mnist", "--epochs", "6", "--target-accuracy", "0.9", *FAST]


@pytest.fixture(scope="module")
def torchrun_mnist(idx_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    summary = tmp_path_factory.mktemp("torchrun") / "summary.json"
    command = support.torchrun_command(
        *MNIST_RUN, "--data-dir", str(idx_data), "--summary-file", str(summary)
    )
    return support.run(command).check(), summary


def test_torchrun_two_processes_reach_the_target_on_idx_files(
    torchrun_mnist: tuple[Run, Path],
) -> None:
    run, summary_file = torchrun_mnist
    summary = support.summary(summary_file)
    assert summary["world_size"] == 2
    assert summary["val_accuracy"] >= 0.9
    assert summary["stopped_early"] is True
    assert summary["epochs_run"] < 6
    assert summary["resumed_from_epoch"] is None
    assert summary["first_epoch_seconds"] > 0
    assert summary["peak_device_memory_mib"] is None  # a GPU's only (tests/trainer/test_cuda.py)
    assert [line["epoch"] for line in run.epochs] == list(range(1, summary["epochs_run"] + 1))
    assert {"loss", "val_loss", "val_accuracy", "images_per_sec", "epoch_time"} <= set(
        run.epochs[0]
    )
    assert "launcher=torchrun backend=gloo" in run.stderr


def test_mpirun_style_run_gets_the_same_ranks_and_result(
    torchrun_mnist: tuple[Run, Path], idx_data: Path, tmp_path: Path
) -> None:
    """Open MPI's variables set by hand, the master from a host file: what mpirun would give."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# written by the MPI operator\n127.0.0.1 slots=2\n")
    port = str(free_port())
    envs = [
        support.clean_env(
            OMPI_COMM_WORLD_RANK=str(rank),
            OMPI_COMM_WORLD_SIZE="2",
            OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
            OMPI_COMM_WORLD_LOCAL_SIZE="2",
            OMPI_MCA_orte_default_hostfile=str(hostfile),
            MASTER_PORT=port,
        )
        for rank in range(2)
    ]
    started = [
        support.start(support.trainer_command(*MNIST_RUN, "--data-dir", str(idx_data)), env)
        for env in envs
    ]
    runs = [support.finish(process).check() for process in started]

    torchrun_run, _ = torchrun_mnist
    mpi_identities = runs[0].identities() | runs[1].identities()
    assert mpi_identities == torchrun_run.identities()
    assert len(mpi_identities) == 2
    assert "launcher=openmpi backend=gloo" in runs[1].stderr
    # Same data, seed, world size and sharding: the same training, epoch by epoch.
    accuracies = [line["val_accuracy"] for line in runs[0].epochs]
    assert accuracies == [line["val_accuracy"] for line in torchrun_run.epochs]


def test_torchrun_on_cifar_batches_through_the_dataloader_path(
    cifar_data: Path, tmp_path: Path
) -> None:
    summary_file = tmp_path / "summary.json"
    command = support.torchrun_command(
        "--dataset=cifar10",
        f"--data-dir={cifar_data}",
        "--epochs=6",
        "--target-accuracy=0.85",
        "--patience=2",
        "--loader=dataloader",
        "--num-workers=1",
        "--augment",
        "--grad-compression=fp16",
        f"--summary-file={summary_file}",
        *FAST,
    )
    run = support.run(command).check()
    summary = support.summary(summary_file)
    assert summary["val_accuracy"] >= 0.85
    assert summary["stopped_early"] is True
    assert summary["epochs_run"] >= 2  # patience 2: two epochs at the target
    assert run.epochs[-1]["val_accuracy"] >= 0.85
    assert run.epochs[-2]["val_accuracy"] >= 0.85


def test_a_killed_run_resumes_at_the_next_epoch_and_skips_a_partial_checkpoint(
    idx_data: Path, tmp_path: Path
) -> None:
    common = ["--dataset=mnist", f"--data-dir={idx_data}", "--epochs=4", *FAST]
    checkpoints = tmp_path / "checkpoints"
    crash_env = support.clean_env(
        DDP_TRAINER_CRASH_ONCE_AT_EPOCH="2",
        DDP_TRAINER_CRASH_MARKER=str(tmp_path / "crashed"),
    )
    interrupted = support.start(
        support.trainer_command(*common, f"--checkpoint-dir={checkpoints}"), crash_env
    )
    uninterrupted = support.start(
        support.trainer_command(*common, f"--summary-file={tmp_path / 'whole.json'}"),
        support.clean_env(),
    )
    killed = support.finish(interrupted)
    whole = support.finish(uninterrupted).check()
    assert killed.returncode != 0  # SIGKILLed after epoch 2's checkpoint
    assert [line["epoch"] for line in killed.epochs] == [1, 2]
    # What a writer killed mid-copy by something less careful than os.replace would leave:
    epoch_two = sorted(checkpoints.glob("checkpoint-step-*.pt"))[-1].read_bytes()
    later = checkpoints / "checkpoint-step-9999999999.pt"
    later.write_bytes(epoch_two[: len(epoch_two) // 2])

    resumed = support.run(
        support.trainer_command(
            *common, f"--checkpoint-dir={checkpoints}", f"--summary-file={tmp_path / 's.json'}"
        ),
        crash_env,
    ).check()
    assert "skipping unreadable checkpoint" in resumed.stderr
    assert later.name in resumed.stderr
    assert [line["epoch"] for line in resumed.epochs] == [3, 4]
    summary = support.summary(tmp_path / "s.json")
    assert summary["resumed_from_epoch"] == 2
    assert summary["epochs_run"] == support.summary(tmp_path / "whole.json")["epochs_run"] == 4
    # Model, optimizer, data order and RNG all restored: the same numbers as never stopping.
    assert resumed.epochs[-1]["val_accuracy"] == whole.epochs[-1]["val_accuracy"]
    assert resumed.epochs[-1]["loss"] == pytest.approx(whole.epochs[-1]["loss"], rel=1e-5)


def test_torchrun_max_restarts_recovers_from_a_rank_that_crashes_once(
    idx_data: Path, tmp_path: Path
) -> None:
    summary_file = tmp_path / "summary.json"
    env = support.clean_env(
        DDP_TRAINER_CRASH_ONCE_AT_EPOCH="1",
        DDP_TRAINER_CRASH_MARKER=str(tmp_path / "crashed"),
        DDP_TRAINER_CRASH_RANK="1",
    )
    command = support.torchrun_command(
        "--dataset=mnist",
        f"--data-dir={idx_data}",
        "--epochs=3",
        f"--checkpoint-dir={tmp_path / 'checkpoints'}",
        f"--summary-file={summary_file}",
        *FAST,
        max_restarts=1,
    )
    run = support.run(command, env).check()
    assert (tmp_path / "crashed").exists()
    assert run.stderr.count("launcher=torchrun") == 4  # two ranks, two attempts
    summary = support.summary(summary_file)
    assert summary["resumed_from_epoch"] == 1
    assert summary["epochs_run"] == 3
    # Epoch 1's line may or may not precede the crash; after it, training went on at 2.
    assert [line["epoch"] for line in run.epochs if line["epoch"] > 1] == [2, 3]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--bogus-option", "1"], "--bogus-option"),
        (["--epochs", "0"], "--epochs"),
        (["--dataset", "imagenet"], "--dataset"),
        (["--target-accuracy", "high"], "--target-accuracy"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args: list[str], named: str) -> None:
    run = support.run(support.trainer_command(*args))
    assert run.returncode == 2
    assert named in run.stderr
    assert "Traceback" not in run.stderr


def test_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    run = support.run(support.trainer_command("--dataset=fashion-mnist", f"--data-dir={tmp_path}"))
    assert run.returncode == EXIT_CONFIG  # a path to fix, not a bug: mount the data there
    assert "train-images-idx3-ubyte" in run.stderr
    assert "--download" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_hung_peer_ends_rank_0_with_the_lost_peer_exit_code(tmp_path: Path) -> None:
    """Rank 1 stopped (SIGSTOP, as a hung rank) mid-training: rank 0's next collective times
    out and the trainer exits with its own code, which the operator retries, not 1."""
    envs = support.two_ranks(KUBEDDP_NODE_NAME="node-{rank}")
    args = ["--dataset", "synthetic", "--epochs", "500", "--timeout-seconds", "10"]
    rank0, rank1 = (support.start(support.trainer_command(*args), env) for env in envs)
    try:
        assert rank0.stdout is not None
        for line in rank0.stdout:  # the first epoch's line: the group trains
            if line.startswith("{"):
                break
        os.kill(rank1.pid, signal.SIGSTOP)
        run = support.finish(rank0)
    finally:
        rank1.kill()
        rank1.wait()
    assert run.returncode == EXIT_PEER_LOST, run.stderr[-2000:]
    assert "a collective timed out or a peer went away" in run.stderr
    # Rank 0 failed, and names the rank that stopped first (its entry in the store went stale).
    assert "rank 1 (pod hung-worker-1, node node-1) stopped first" in run.stderr, run.stderr[-2000:]
    assert "silent for" in run.stderr


def test_a_rank_hung_in_its_own_code_is_named_and_shows_where_it_is() -> None:
    """Rank 1 sleeps in Python after epoch 1 (its process runs on, unlike a SIGSTOP): rank 0
    times out, exits 88 and names rank 1 by its collectives, fallen behind; rank 1 has logged
    its stack, stalled in the hook, before the timeout."""
    envs = support.two_ranks(DDP_TRAINER_HANG_AT_EPOCH="1")
    args = ["--dataset", "synthetic", "--epochs", "500", "--timeout-seconds", "12"]
    run, hung_stderr = support.hung_rank_run(args, envs)
    assert run.returncode == EXIT_PEER_LOST, run.stderr[-2000:]
    said = "rank 1 (pod hung-worker-1, node "
    assert said in run.stderr and "collective(s) behind the others" in run.stderr, run.stderr
    assert "silent for" not in run.stderr  # its ledger thread wrote on
    assert "no step for" in hung_stderr, hung_stderr[-2000:]
    assert "in hang_if_asked" in hung_stderr  # faulthandler's stack: where it hangs


@pytest.mark.parametrize(("precision", "scaled"), [("fp16", True), ("bf16", False)])
def test_both_mixed_precisions_train_and_only_fp16_scales_the_loss(
    tmp_path: Path, precision: str, scaled: bool
) -> None:
    """What auto picks on a GPU with and without native bf16, under CPU autocast: fp16 with a
    GradScaler (its state saved with the checkpoint), bf16 without one."""
    checkpoints = tmp_path / "checkpoints"
    command = support.torchrun_command(
        "--dataset=digits",
        "--model=mlp",
        "--epochs=3",
        f"--precision={precision}",
        f"--checkpoint-dir={checkpoints}",
    )
    run = support.run(command).check()
    assert run.epochs[-1]["val_accuracy"] >= 0.8
    latest = sorted(checkpoints.glob("checkpoint-step-*.pt"))[-1]
    state = torch.load(latest, map_location="cpu", weights_only=True)
    assert (state["scaler"] is not None) is scaled
    if scaled:
        assert state["scaler"]["scale"] > 0
