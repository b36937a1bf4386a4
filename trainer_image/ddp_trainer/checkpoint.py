"""Checkpoints: written atomically by rank 0, the last K kept, the newest readable one resumed.

A checkpoint is `checkpoint-epoch-NNNNN.pt` holding a dict of plain state (state_dicts,
numbers, RNG tensors), loadable with `weights_only=True`, in a directory or an S3-compatible
object store (`ddp_trainer.stores`: `--checkpoint-dir s3://bucket/prefix`). Either store writes
atomically, so a killed writer leaves either the old set or the new checkpoint, never a
half-written one under its name. One that still fails to load (a truncated copy, a full disk on
another system) is skipped with a warning and the next older one is tried.
"""

from __future__ import annotations

import io
import logging
import os
import re
from typing import Any

import torch

from ddp_trainer.errors import StorageError, TemporaryError
from ddp_trainer.stores import Store, open_store

log = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-epoch-(\d+)\.pt$")
REQUIRED_KEYS = frozenset({"epoch", "model", "optimizer"})


def checkpoint_name(epoch: int) -> str:
    return f"checkpoint-epoch-{epoch:05d}.pt"


def list_checkpoints(store: Store) -> list[tuple[int, str]]:
    """(epoch, name) of every checkpoint in the store, oldest first."""
    found = []
    for name in store.names():
        match = _NAME.match(name)
        if match:
            found.append((int(match.group(1)), name))
    return sorted(found)


def save_checkpoint(
    state: dict[str, Any], location: str | os.PathLike[str], epoch: int, keep: int
) -> str:
    """Write `state` as the checkpoint of `epoch`, then remove all but the newest `keep`;
    returns where it went.

    A store that cannot be written (permissions, a full disk, a wrong key) is a
    `StorageError`."""
    store = open_store(location)
    # Serialised in memory first: torch.save into a file turns a full disk into an opaque
    # RuntimeError; a plain write says ENOSPC.
    serialised = io.BytesIO()
    torch.save(state, serialised)
    name = checkpoint_name(epoch)
    store.write(name, serialised.getbuffer())
    for _, old in list_checkpoints(store)[:-keep]:
        store.delete(old)
    return store.location(name)


def load_latest_checkpoint(
    location: str | os.PathLike[str],
) -> tuple[dict[str, Any], str] | None:
    """The newest checkpoint that loads and has the required keys, and where it was; or None."""
    store = open_store(location)
    for _, name in reversed(list_checkpoints(store)):
        where = store.location(name)
        try:
            state = torch.load(io.BytesIO(store.read(name)), map_location="cpu", weights_only=True)
        except (StorageError, TemporaryError):
            raise  # the store itself: an older checkpoint would hide it
        except Exception as exc:  # a truncated copy, a foreign file, one removed meanwhile
            log.warning("skipping unreadable checkpoint %s: %s", where, _first_line(exc))
            continue
        if not isinstance(state, dict) or not state.keys() >= REQUIRED_KEYS:
            log.warning("skipping checkpoint %s: not a ddp_trainer checkpoint", where)
            continue
        return state, where
    return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
