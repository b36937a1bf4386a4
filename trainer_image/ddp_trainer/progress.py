"""What rank 0 shows: a progress bar on a terminal, one JSON line per epoch, the summary file."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from ddp_trainer.errors import storage


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch, from the all-reduced sums: identical on every rank."""

    epoch: int
    loss: float
    val_loss: float
    val_accuracy: float
    images_per_sec: float
    epoch_time: float


@dataclass(frozen=True)
class Summary:
    """The run's outcome (`--summary-file`)."""

    world_size: int
    epochs_run: int  # epochs completed, including those before a resume
    val_accuracy: float
    best_val_accuracy: float
    images_per_sec: float  # training throughput of this run, first epoch excluded when >1
    stopped_early: bool
    resumed_from_epoch: int | None


def epoch_line(metrics: EpochMetrics) -> str:
    rounded = {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(metrics).items()}
    return json.dumps(rounded)


def write_summary(path: Path, summary: Summary) -> None:
    """Atomically: a reader polling for the file never sees half of it."""
    temporary = path.with_name(f".{path.name}.tmp")
    with storage(path, "cannot write the summary"):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(asdict(summary), indent=2) + "\n")
        os.replace(temporary, path)


class ProgressBar:
    """A one-line bar on stderr, redrawn at most 10 times a second; silent unless a terminal.

    It counts host-side steps only, so drawing it never waits for the device.
    """

    WIDTH = 30

    def __init__(self, enabled: bool, stream: TextIO = sys.stderr) -> None:
        self.enabled = enabled and stream.isatty()
        self.stream = stream
        self.drawn_at = 0.0

    def update(self, epoch: int, epochs: int, step: int, steps: int, started: float) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.drawn_at < 0.1 and step < steps:
            return
        self.drawn_at = now
        done = int(self.WIDTH * step / max(steps, 1))
        bar = "#" * done + "." * (self.WIDTH - done)
        rate = step / max(now - started, 1e-9)
        self.stream.write(f"\repoch {epoch}/{epochs} [{bar}] {step}/{steps} ({rate:.1f} steps/s)")
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
