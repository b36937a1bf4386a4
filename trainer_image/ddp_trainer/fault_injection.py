"""Test hooks, inert unless their variables are set: one rank crashes once at a chosen epoch,
or hangs there; each rank logs a digest of every batch it trains on.

  DDP_TRAINER_CRASH_ONCE_AT_EPOCH=k   after epoch k (and its checkpoint) ...
  DDP_TRAINER_CRASH_ONCE_AT_STEP=k    ... or after global step k (and its checkpoint) ...
  DDP_TRAINER_CRASH_MARKER=path       ... if this file does not exist yet, create it and ...
  DDP_TRAINER_CRASH_RANK=r            ... kill rank r (default: the last rank) with SIGKILL,
                                      like an OOM kill or a lost node.

  DDP_TRAINER_BATCH_LOG=path         each rank appends a JSON line per step to path.rank<r>:
                                      the global step, a digest of its batch, its loss
  DDP_TRAINER_STEP_SECONDS=s          ... and then sleeps s seconds: a run slow enough for a
                                      test to act while it trains

The marker makes it happen once per marker file, so the relaunch (by torchrun --max-restarts,
by the operator or by hand) trains on from the checkpoint. tests/trainer uses it to show
exactly that; tests/e2e and benchmarks/ slow the steps with the batch log. Jobs should set none
of these variables. A process that is its container's PID 1 ignores its own SIGKILL (the kernel
protects a PID namespace's init): in a pod that runs the trainer directly, kill it from the node
instead, as tests/e2e does.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO


def crash_once_if_asked(
    epoch: int,
    rank: int,
    world_size: int,
    env: Mapping[str, str],
    before: Callable[[], object] = lambda: None,
    *,
    step: int | None = None,
) -> None:
    """Called after each epoch, or with `step` after each global step; `before` runs first
    (the trainer finishes the checkpoint it is writing)."""
    if step is None:
        at, now = env.get("DDP_TRAINER_CRASH_ONCE_AT_EPOCH"), epoch
    else:
        at, now = env.get("DDP_TRAINER_CRASH_ONCE_AT_STEP"), step
    marker = env.get("DDP_TRAINER_CRASH_MARKER")
    if not (at and marker) or int(at) != now:
        return
    if rank != int(env.get("DDP_TRAINER_CRASH_RANK", world_size - 1)):
        return
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return  # crashed once already
    before()
    os.kill(os.getpid(), signal.SIGKILL)


def hang_if_asked(epoch: int, rank: int, world_size: int, env: Mapping[str, str]) -> None:
    """DDP_TRAINER_HANG_AT_EPOCH=k: after epoch k, rank DDP_TRAINER_CRASH_RANK (default the
    last) sleeps forever in Python, as a rank hung in its own code (a data loader, a deadlock)."""
    at_epoch = env.get("DDP_TRAINER_HANG_AT_EPOCH")
    if not at_epoch or int(at_epoch) != epoch:
        return
    if rank == int(env.get("DDP_TRAINER_CRASH_RANK", world_size - 1)):
        while True:
            time.sleep(1)


class BatchLog:
    """DDP_TRAINER_BATCH_LOG: what each step trained on, to compare a resumed run with an
    uninterrupted one. Reading the loss syncs with the device: a test hook only."""

    def __init__(self, file: TextIO, rank: int, pause: float = 0.0) -> None:
        self.file = file
        self.rank = rank
        self.pause = pause

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int) -> BatchLog | None:
        path = env.get("DDP_TRAINER_BATCH_LOG")
        if not path:
            return None
        pause = float(env.get("DDP_TRAINER_STEP_SECONDS") or 0)
        return cls(Path(f"{path}.rank{rank}").open("a", buffering=1), rank, pause)

    def step(self, step: int, inputs: Any, labels: Any, loss: Any) -> None:
        digest = hashlib.sha256()
        for tensor in (inputs, labels):
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        line = {"step": step, "batch": digest.hexdigest()[:16], "loss": float(loss)}
        self.file.write(json.dumps(line) + "\n")
        if self.pause:
            time.sleep(self.pause)
