"""Checkpoints: atomic writes, the last K kept, unreadable ones skipped."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_trainer.checkpoint import list_checkpoints, load_latest_checkpoint, save_checkpoint
from ddp_trainer.stores import DirectoryStore


def _state(epoch: int) -> dict[str, Any]:
    return {"epoch": epoch, "model": {"w": torch.full((4,), float(epoch))}, "optimizer": {}}


class Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("disk full, say")


def test_the_last_k_checkpoints_are_kept(tmp_path: Path) -> None:
    for epoch in range(1, 6):
        save_checkpoint(_state(epoch), tmp_path, epoch, keep=2)
    assert [epoch for epoch, _ in list_checkpoints(DirectoryStore(tmp_path))] == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-epoch-00004.pt",
        "checkpoint-epoch-00005.pt",
    ]


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(_state(1), tmp_path, 1, keep=3)
    broken = {**_state(2), "extra": [torch.zeros(1000), Unpicklable()]}
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(broken, tmp_path, 2, keep=3)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-epoch-00001.pt"]
    state, path = load_latest_checkpoint(tmp_path) or ({}, None)
    assert state["epoch"] == 1
    assert path == str(tmp_path / "checkpoint-epoch-00001.pt")


def test_leftovers_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    leftover = tmp_path / ".checkpoint-epoch-00002.pt.4242.tmp"
    tmp_path.joinpath(leftover.name).write_bytes(b"half")
    save_checkpoint(_state(2), tmp_path, 2, keep=3)
    assert not leftover.exists()


def test_truncated_and_foreign_checkpoints_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for epoch in (1, 2, 3):
        save_checkpoint(_state(epoch), tmp_path, epoch, keep=5)
    newest = tmp_path / "checkpoint-epoch-00003.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    torch.save({"weights": 1}, tmp_path / "checkpoint-epoch-00002.pt")  # not ours
    with caplog.at_level(logging.WARNING):
        found = load_latest_checkpoint(tmp_path)
    assert found is not None
    state, _ = found
    assert state["epoch"] == 1
    assert torch.equal(state["model"]["w"], torch.ones(4))
    assert "skipping unreadable checkpoint" in caplog.text
    assert "checkpoint-epoch-00003.pt" in caplog.text
    assert "not a ddp_trainer checkpoint" in caplog.text


def test_nothing_to_resume(tmp_path: Path) -> None:
    assert load_latest_checkpoint(tmp_path / "absent") is None
    (tmp_path / "checkpoint-epoch-00001.pt").write_bytes(b"")
    assert load_latest_checkpoint(tmp_path) is None
