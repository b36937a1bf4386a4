"""Checkpoints: written atomically by rank 0, the last K kept, the newest readable one resumed.

A checkpoint is `checkpoint-epoch-NNNNN.pt` holding a dict of plain state (state_dicts,
numbers, RNG tensors), loadable with `weights_only=True`. It is written to a hidden temporary
file, fsynced and renamed, so a killed writer leaves either the old set or the new file, never
a half-written one under the real name. A file that still fails to load (a truncated copy, a
full disk on another system) is skipped with a warning and the next older one is tried.
"""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from ddp_trainer.errors import storage

log = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-epoch-(\d+)\.pt$")
REQUIRED_KEYS = frozenset({"epoch", "model", "optimizer"})


def checkpoint_path(directory: Path, epoch: int) -> Path:
    return directory / f"checkpoint-epoch-{epoch:05d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(epoch, path) of every checkpoint in the directory, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    with storage(directory, "cannot list checkpoints in"):
        paths = list(directory.iterdir())
    for path in paths:
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(state: dict[str, Any], directory: Path, epoch: int, keep: int) -> Path:
    """Write `state` as the checkpoint of `epoch`, then remove all but the newest `keep`.

    A directory that cannot be written (permissions, a full disk) is a `StorageError`."""
    final = checkpoint_path(directory, epoch)
    temporary = directory / f".{final.name}.{os.getpid()}.tmp"
    with storage(final, "cannot write the checkpoint"):
        directory.mkdir(parents=True, exist_ok=True)
        try:
            # Serialised in memory first: torch.save into a file turns a full disk into an
            # opaque RuntimeError; a plain write says ENOSPC.
            serialised = io.BytesIO()
            torch.save(state, serialised)
            with temporary.open("wb") as file:
                file.write(serialised.getbuffer())
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, final)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _fsync_directory(directory)  # the rename itself survives a crash
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    for leftover in directory.glob(".checkpoint-epoch-*.tmp"):
        if leftover != temporary:
            leftover.unlink(missing_ok=True)  # from writers killed mid-save
    return final


def load_latest_checkpoint(directory: Path) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that loads and has the required keys, or None."""
    for _, path in reversed(list_checkpoints(directory)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            log.warning("skipping unreadable checkpoint %s: %s", path, _first_line(exc))
            continue
        if not isinstance(state, dict) or not state.keys() >= REQUIRED_KEYS:
            log.warning("skipping checkpoint %s: not a ddp_trainer checkpoint", path)
            continue
        return state, path
    return None


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
