"""Checkpoints: written atomically by rank 0 beside training, the last K kept, the newest
readable one resumed.

A checkpoint is `checkpoint-step-NNNNNNNNNN.pt`, named by the global step it was taken after
(steps counted across epochs), so the newest sorts last; `checkpoint-epoch-NNNNN.pt` files of
earlier versions are still read, older than any step-named one. Each holds a dict of plain
state (state_dicts, numbers, RNG tensors), loadable with `weights_only=True`.

Saving has two halves. `snapshot` runs on the training thread and copies the state to CPU
memory, so training may change its tensors the moment it returns. `Saver` then serialises
and writes that copy in a background thread, one write in flight. A write goes to a hidden
temporary name, is fsynced and renamed, so a killed writer leaves either the old set or the
new file, never a half-written one under a real name. A file that still fails to load (a
truncated copy, a full disk on another system) is skipped with a warning and the next older
one is tried.

DDP keeps every rank's model and optimizer identical, so rank 0 alone writes the whole state;
sharding the write by rank would only pay for states larger than one host's write bandwidth
allows within a checkpoint interval.

Where the bytes live is `DirectoryStore`'s one job (list, write atomically, read, delete).
"""

from __future__ import annotations

import io
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from ddp_trainer.errors import storage

log = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(epoch|step)-(\d+)\.pt$")
_TEMPORARY = re.compile(r"^\.checkpoint-.*\.tmp$")
REQUIRED_KEYS = frozenset({"epoch", "model", "optimizer"})


class DirectoryStore:
    """Checkpoint files in one directory: the only file I/O of checkpoints."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def location(self, name: str) -> str:
        return str(self.directory / name)

    def names(self) -> list[str]:
        """Every name in the store, temporary ones included; none when it does not exist."""
        if not self.directory.is_dir():
            return []
        with storage(self.directory, "cannot list checkpoints in"):
            return [path.name for path in self.directory.iterdir()]

    def write(self, name: str, data: bytes | memoryview) -> None:
        """`data` under `name`, all or nothing: a temporary file, fsynced, then renamed."""
        final = self.directory / name
        temporary = self.directory / f".{name}.{os.getpid()}.tmp"
        with storage(final, "cannot write the checkpoint"):
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                with temporary.open("wb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, final)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
            _fsync_directory(self.directory)  # the rename itself survives a crash

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def delete(self, name: str) -> None:
        (self.directory / name).unlink(missing_ok=True)


def checkpoint_name(step: int) -> str:
    return f"checkpoint-step-{step:010d}.pt"


def _order(name: str) -> tuple[int, int] | None:
    """Where a checkpoint's name sorts (legacy epoch names first), or None for other files."""
    match = _NAME.match(name)
    if not match:
        return None
    return (0 if match.group(1) == "epoch" else 1, int(match.group(2)))


def list_checkpoints(store: DirectoryStore) -> list[str]:
    """The names of every checkpoint in the store, oldest first."""
    found = [(order, name) for name in store.names() if (order := _order(name)) is not None]
    return [name for _, name in sorted(found)]


def save_checkpoint(state: dict[str, Any], store: DirectoryStore, step: int, keep: int) -> str:
    """Write `state` as the checkpoint of global step `step`, then remove all but the newest
    `keep`. A store that cannot be written (permissions, a full disk) is a `StorageError`."""
    name = checkpoint_name(step)
    # Serialised in memory first: torch.save into a file turns a full disk into an opaque
    # RuntimeError; a plain write says ENOSPC.
    serialised = io.BytesIO()
    torch.save(state, serialised)
    store.write(name, serialised.getbuffer())
    for old in list_checkpoints(store)[:-keep]:
        store.delete(old)
    for leftover in store.names():
        if _TEMPORARY.match(leftover) and f".{os.getpid()}." not in leftover:
            store.delete(leftover)  # from writers killed mid-save
    return name


def load_latest_checkpoint(store: DirectoryStore) -> tuple[dict[str, Any], str] | None:
    """The newest checkpoint that loads and has the required keys, with where it is, or None."""
    for name in reversed(list_checkpoints(store)):
        where = store.location(name)
        try:
            state = torch.load(io.BytesIO(store.read(name)), map_location="cpu", weights_only=True)
        except Exception as exc:
            log.warning("skipping unreadable checkpoint %s: %s", where, _first_line(exc))
            continue
        if not isinstance(state, dict) or not state.keys() >= REQUIRED_KEYS:
            log.warning("skipping checkpoint %s: not a ddp_trainer checkpoint", where)
            continue
        return state, where
    return None


def snapshot(value: Any) -> Any:
    """A copy of nested state whose tensors live in CPU memory of their own: what the
    training thread hands to a background write, free to change its own tensors after."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(item) for item in value)
    return value


@dataclass(frozen=True)
class Saved:
    """A completed save: status.training.checkpoint."""

    step: int
    epoch: int
    saved_at: datetime
    seconds: float  # from the snapshot to the renamed file
    paused: float  # of those, the snapshot's: the only part training waited for


class Saver:
    """Rank 0's writer: one background write in flight; an error surfaces on the training
    thread at the next `save` or `wait`."""

    def __init__(self, store: DirectoryStore, keep: int, now: Callable[[], datetime]) -> None:
        self.store = store
        self.keep = keep
        self.now = now
        self.last: Saved | None = None  # the newest completed save
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, state: dict[str, Any], step: int, epoch: int, wait: bool = False) -> None:
        """Snapshot `state` now and write it in the background (or before returning)."""
        self.wait()  # one write in flight
        started = time.perf_counter()
        copied = snapshot(state)
        paused = time.perf_counter() - started
        self._thread = threading.Thread(
            target=self._write,
            args=(copied, step, epoch, started, paused),
            name="checkpoint-writer",
        )
        self._thread.start()
        if wait:
            self.wait()

    def _write(
        self, state: dict[str, Any], step: int, epoch: int, started: float, paused: float
    ) -> None:
        try:
            save_checkpoint(state, self.store, step, self.keep)
        except BaseException as exc:  # raised again on the training thread
            self._error = exc
            return
        self.last = Saved(step, epoch, self.now(), time.perf_counter() - started, paused)

    def wait(self) -> Saved | None:
        """Until the write in flight is done; raises its error, if it had one."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self.last


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
