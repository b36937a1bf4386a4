"""The Gaudi path's process-group assumptions, on CPU: `hccl` as an out-of-tree backend (the
stand-in `habana_frameworks` in gaudi_standin/, registered through torch's
`Backend.register_backend` as Habana's module registers its own), with only the collectives
DDP and the trainer need and no sequence numbers. docs/design.md ("Accelerators") says which
assumptions this covers and which only a Gaudi can settle."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ddp_trainer import distributed
from ddp_trainer.contract import EXIT_PEER_LOST
from tests.trainer import support

STANDIN = Path(__file__).parent / "gaudi_standin"
DIGITS = ["--dataset=digits", "--model=mlp", "--device=cpu", "--timeout-seconds=60"]
NO_COUNT = "keeps no count of collectives"


def hccl_env(**extra: str) -> dict[str, str]:
    return support.clean_env(DDP_BACKEND="hccl", PYTHONPATH=str(STANDIN), **extra)


def test_two_ranks_train_save_and_resume_on_hccl_without_sequence_numbers(tmp_path: Path) -> None:
    """DDP's gradients, the metrics' all-reduce, BatchNorm's broadcast and the checkpoint found
    by rank 0 sent to the others (an object broadcast), all through the out-of-tree backend;
    the progress ledger says once per rank that it counts steps instead."""
    checkpoints = tmp_path / "checkpoints"
    common = [*DIGITS, f"--checkpoint-dir={checkpoints}"]
    first = support.run(support.torchrun_command(*common, "--epochs=2"), hccl_env()).check()
    assert "backend=hccl" in first.stderr
    assert first.stderr.count(NO_COUNT) == 2, first.stderr[-3000:]
    summary = tmp_path / "summary.json"
    resumed = support.run(
        support.torchrun_command(*common, "--epochs=4", f"--summary-file={summary}"), hccl_env()
    ).check()
    assert [line["epoch"] for line in resumed.epochs] == [3, 4]
    result = support.summary(summary)
    assert (result["resumed_from_epoch"], result["world_size"]) == (2, 2)
    assert result["val_accuracy"] >= 0.8


def test_a_hung_rank_is_named_by_its_steps_when_collectives_are_not_counted() -> None:
    """The culprit ledger degrades, it does not fail: rank 1 hangs in its own code, rank 0
    times out and names it by the training steps it fell behind."""
    envs = [
        {**env, "DDP_BACKEND": "hccl", "PYTHONPATH": str(STANDIN)}
        for env in support.two_ranks(DDP_TRAINER_HANG_AT_EPOCH="1")
    ]
    args = ["--dataset=synthetic", "--device=cpu", "--epochs=500", "--timeout-seconds=12"]
    run, _ = support.hung_rank_run(args, envs)
    assert run.returncode == EXIT_PEER_LOST, run.stderr[-2000:]
    assert "rank 1 (pod hung-worker-1, node " in run.stderr, run.stderr[-2000:]
    assert "step(s) behind the others" in run.stderr


@pytest.fixture
def standin_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in [m for m in sys.modules if m.startswith("habana_frameworks")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.usefixtures("standin_on_path")
@pytest.mark.parametrize(("variable", "marks"), [(None, True), ("1", True), ("0", False)])
def test_lazy_mode_is_read_from_habana_frameworks(
    monkeypatch: pytest.MonkeyPatch, variable: str | None, marks: bool
) -> None:
    """A release whose default is lazy (the stand-in's is_lazy, as 1.19's): unset, the steps
    must end at mark_step()."""
    if variable is None:
        monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    else:
        monkeypatch.setenv("PT_HPU_LAZY_MODE", variable)
    from habana_frameworks.torch.core import steps_marked  # the stand-in's

    before = steps_marked[0]
    distributed.lazy_mode_step_marker(torch.device("hpu"))()
    distributed.lazy_mode_step_marker(torch.device("cpu"))()  # never on another device
    assert steps_marked[0] - before == int(marks)
