"""The trainer's CUDA path on a real GPU: what auto picks, both mixed precisions, both input
pipelines, a checkpoint written and resumed on the device, torch.compile, two ranks refused on
one GPU, the straggler clock of a GPU-bound rank, and `kube-ddp run --local` of an nvidia job,
each under the pods' command where it runs the trainer. Skipped where no GPU is visible;
`benchmarks/gpu_run.sh` runs them on a GPU machine with the carried dependencies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from ddp_trainer.contract import EXIT_CONFIG
from ddp_trainer.distributed import ComputeClock
from tests.trainer import support

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_run.sh runs these)"
)

DIGITS = ("--dataset=digits", "--model=mlp", "--batch-size=32", "--timeout-seconds=120")


def on_one_gpu(*args: str) -> list[str]:
    """The trainer as a pod of one GPU runs it: the pods' command, a world of one."""
    return support.wrapped_torchrun_command("-m", "ddp_trainer", *DIGITS, *args, nproc=1)


def latest_checkpoint(directory: Path) -> dict[str, object]:
    newest = sorted(directory.glob("checkpoint-step-*.pt"))[-1]
    return dict(torch.load(newest, map_location="cpu", weights_only=True))


def test_auto_trains_on_the_gpu_in_bf16_with_no_group(tmp_path: Path) -> None:
    summary_file, checkpoints = tmp_path / "summary.json", tmp_path / "checkpoints"
    command = on_one_gpu(
        "--epochs=3", f"--summary-file={summary_file}", f"--checkpoint-dir={checkpoints}"
    )
    run = support.run(command).check()
    assert "backend=none device=cuda:0" in run.stderr, run.stderr[-3000:]  # alone: no NCCL
    summary = support.summary(summary_file)
    assert summary["val_accuracy"] >= 0.8, run.stderr[-3000:]
    assert summary["peak_device_memory_mib"] > 0
    state = latest_checkpoint(checkpoints)
    assert state["scaler"] is None  # bf16 on a GPU that computes it: no loss scaling
    assert "cuda" in state["rng"]  # type: ignore[operator]


def test_fp16_scales_the_loss_and_saves_the_scaler(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    command = on_one_gpu("--epochs=3", "--precision=fp16", f"--checkpoint-dir={checkpoints}")
    run = support.run(command).check()
    assert run.epochs[-1]["val_accuracy"] >= 0.8, run.stderr[-3000:]
    scaler = latest_checkpoint(checkpoints)["scaler"]
    assert isinstance(scaler, dict) and scaler["scale"] > 0


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_both_input_pipelines_train_on_the_gpu(loader: str) -> None:
    run = support.run(on_one_gpu("--epochs=3", f"--loader={loader}")).check()
    assert run.epochs[-1]["val_accuracy"] >= 0.8, run.stderr[-3000:]


def test_a_checkpoint_written_on_the_gpu_resumes_there(tmp_path: Path) -> None:
    checkpoints, summary_file = tmp_path / "checkpoints", tmp_path / "summary.json"
    support.run(on_one_gpu("--epochs=2", f"--checkpoint-dir={checkpoints}")).check()
    run = support.run(
        on_one_gpu(
            "--epochs=4", f"--checkpoint-dir={checkpoints}", f"--summary-file={summary_file}"
        )
    ).check()
    summary = support.summary(summary_file)
    assert summary["resumed_from_epoch"] == 2, run.stderr[-3000:]
    assert summary["epochs_run"] == 4
    assert [line["epoch"] for line in run.epochs] == [3, 4]


def test_compile_trains_a_resnet_on_the_gpu(tmp_path: Path) -> None:
    summary_file = tmp_path / "summary.json"
    command = support.wrapped_torchrun_command(
        "-m",
        "ddp_trainer",
        "--dataset=synthetic",
        "--synthetic-shape=3x32x32",
        "--synthetic-samples=4096",
        "--model=resnet18",
        "--epochs=2",
        "--compile",
        f"--summary-file={summary_file}",
        nproc=1,
    )
    run = support.run(command).check()
    assert support.summary(summary_file)["images_per_sec"] > 0, run.stderr[-3000:]


def test_a_gpu_bound_rank_is_timed_without_the_host_waiting() -> None:
    """Matmuls queued far faster than the GPU runs them: the clock's events are read as the
    GPU finishes them (tests/trainer/test_compute_clock.py proves the bookkeeping on a CPU)."""
    clock = ComputeClock(torch.device("cuda", 0))
    a = torch.randn(4096, 4096, device="cuda")
    laps = []
    for _ in range(40):
        clock.start()
        a = (a @ a).tanh_()
        laps.append(clock.lap())
    torch.cuda.synchronize()
    clock.start()
    laps.append(clock.lap())
    timed = [lap for lap in laps if lap is not None]
    assert timed and min(timed) > 0, laps


def test_two_ranks_on_one_gpu_is_a_config_error() -> None:
    env = support.clean_env(CUDA_VISIBLE_DEVICES="0")
    run = support.run(support.wrapped_torchrun_command("-m", "ddp_trainer", *DIGITS), env=env)
    assert run.returncode == EXIT_CONFIG, run.stderr[-3000:]
    assert "2 processes on this node (nprocPerNode) but 1 CUDA device(s)" in run.stderr, run.stderr


def test_run_local_gives_an_nvidia_worker_its_gpu(tmp_path: Path) -> None:
    job = {
        "apiVersion": "kubeddp.io/v1alpha1",
        "kind": "DDPTrainingJob",
        "metadata": {"name": "digits-gpu"},
        "spec": {
            "nodes": 1,
            "accelerator": {"type": "nvidia", "perNode": 1},
            "trainer": {"dataset": "digits", "model": "mlp", "epochs": 3, "batchSize": 32},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    command = [sys.executable, "-m", "kube_ddp.cli", "run", "--local", str(path)]
    run = support.run(command, cwd=tmp_path).check()
    assert "device=cuda:0" in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
    assert "Succeeded" in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
