"""Checkpoints: atomic writes, the last K kept, unreadable ones skipped, writes beside training."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_trainer.checkpoint import (
    DirectoryStore,
    Saver,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
)


def _state(step: int) -> dict[str, Any]:
    return {"epoch": step, "model": {"w": torch.full((4,), float(step))}, "optimizer": {}}


class Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("disk full, say")


def test_the_last_k_checkpoints_are_kept_the_newest_step_last(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    for step in (5, 10, 95, 100, 1000):
        save_checkpoint(_state(step), store, step, keep=2)
    assert list_checkpoints(store) == [
        "checkpoint-step-0000000100.pt",
        "checkpoint-step-0000001000.pt",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == list_checkpoints(store)


def test_epoch_checkpoints_of_earlier_versions_are_read_before_step_ones(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    torch.save(_state(7), tmp_path / "checkpoint-epoch-00007.pt")
    found = load_latest_checkpoint(store)
    assert found is not None and found[0]["epoch"] == 7
    save_checkpoint(_state(3), store, 3, keep=5)
    assert list_checkpoints(store) == ["checkpoint-epoch-00007.pt", "checkpoint-step-0000000003.pt"]
    found = load_latest_checkpoint(store)
    assert found is not None and found[0]["epoch"] == 3


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    save_checkpoint(_state(1), store, 1, keep=3)
    broken = {**_state(2), "extra": [torch.zeros(1000), Unpicklable()]}
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(broken, store, 2, keep=3)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-step-0000000001.pt"]
    state, where = load_latest_checkpoint(store) or ({}, None)
    assert state["epoch"] == 1
    assert where == str(tmp_path / "checkpoint-step-0000000001.pt")


def test_leftovers_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    leftover = tmp_path / ".checkpoint-step-0000000002.pt.4242.tmp"
    leftover.write_bytes(b"half")
    save_checkpoint(_state(2), DirectoryStore(tmp_path), 2, keep=3)
    assert not leftover.exists()


def test_truncated_and_foreign_checkpoints_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = DirectoryStore(tmp_path)
    for step in (1, 2, 3):
        save_checkpoint(_state(step), store, step, keep=5)
    newest = tmp_path / "checkpoint-step-0000000003.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    torch.save({"weights": 1}, tmp_path / "checkpoint-step-0000000002.pt")  # not ours
    with caplog.at_level(logging.WARNING):
        found = load_latest_checkpoint(store)
    assert found is not None
    state, _ = found
    assert state["epoch"] == 1
    assert torch.equal(state["model"]["w"], torch.ones(4))
    assert "skipping unreadable checkpoint" in caplog.text
    assert "checkpoint-step-0000000003.pt" in caplog.text
    assert "not a ddp_trainer checkpoint" in caplog.text


def test_nothing_to_resume(tmp_path: Path) -> None:
    assert load_latest_checkpoint(DirectoryStore(tmp_path / "absent")) is None
    (tmp_path / "checkpoint-step-0000000001.pt").write_bytes(b"")
    assert load_latest_checkpoint(DirectoryStore(tmp_path)) is None


def test_a_background_save_holds_the_state_of_the_moment_it_was_asked(tmp_path: Path) -> None:
    """Training goes on changing its tensors while the write runs: the checkpoint has the
    values they had at the snapshot."""
    weights = torch.zeros(1_000_000)
    saver = Saver(DirectoryStore(tmp_path), keep=2, now=lambda: datetime.now(UTC))
    saver.save({"epoch": 0, "model": {"w": weights}, "optimizer": {}}, step=1, epoch=0)
    weights += 1  # the next training step, in place
    saved = saver.wait()
    assert saved is not None and saved.step == 1 and saved.seconds > 0
    found = load_latest_checkpoint(DirectoryStore(tmp_path))
    assert found is not None
    assert float(found[0]["model"]["w"].sum()) == 0.0


def test_an_error_of_a_background_save_surfaces_on_the_training_thread(tmp_path: Path) -> None:
    saver = Saver(DirectoryStore(tmp_path), keep=2, now=lambda: datetime.now(UTC))
    saver.save({**_state(1), "extra": Unpicklable()}, step=1, epoch=0)
    with pytest.raises(RuntimeError, match="disk full"):
        saver.wait()
    assert saver.wait() is None  # raised once; nothing saved
