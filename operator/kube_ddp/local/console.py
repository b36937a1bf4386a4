"""What a person sees of a local run: worker logs prefixed `[worker-i]` (or in files), the
job's Events, one live progress line, and a summary table at the end."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

from kube_ddp.api import JobStatus, TrainingProgress
from kube_ddp.local.plan import WorkerLaunch
from kube_ddp.status import Event
from kube_ddp.terminal import printable, printable_line


@dataclass
class WorkerRecord:
    """One worker process of one attempt, for the summary."""

    pod: str
    attempt: int
    pid: int | None
    exit_code: int | None = None
    reason: str | None = None
    seconds: float | None = None
    stopped: bool = False


def progress_line(job_name: str, status: JobStatus) -> str:
    """`digits  Running  restarts 1  epoch 3/12  val-acc 0.912  images/s 1234`."""
    parts = [job_name, status.phase or "Pending"]
    if status.restarts:
        parts.append(f"restarts {status.restarts}")
    training = status.training or TrainingProgress()
    if training.epoch is not None:
        parts.append(f"epoch {training.epoch}/{training.epochs or '?'}")
    if training.val_accuracy is not None:
        parts.append(f"val-acc {training.val_accuracy:.3f}")
    if training.images_per_sec is not None:
        parts.append(f"images/s {training.images_per_sec:.0f}")
    return "  ".join(parts)


class Console:
    """Serialises every line; on a terminal keeps the progress line last and rewrites it,
    elsewhere prints it whenever it changes."""

    def __init__(self, out: TextIO, err: TextIO, logs_dir: Path | None) -> None:
        self.out, self.err = out, err
        self.logs_dir = logs_dir
        self.live = err.isatty()
        self._lock = threading.Lock()
        self._shown = ""  # the progress line on screen (terminal)
        self._last = ""  # the progress line last printed (elsewhere)
        self._files: dict[str, IO[str]] = {}
        if logs_dir is not None:
            logs_dir.mkdir(parents=True, exist_ok=True)

    def worker_line(self, launch: WorkerLaunch, line: str) -> None:
        if self.logs_dir is not None:  # a file gets the line as the worker wrote it
            with self._lock:
                self._log_file(launch).write(line + "\n")
            return
        prefix = f"[worker-{launch.index}]"
        self._print(self.out, f"{prefix} {printable_line(line)}")

    def _log_file(self, launch: WorkerLaunch) -> IO[str]:
        key = f"{launch.pod}-attempt-{launch.attempt}"
        if key not in self._files:
            assert self.logs_dir is not None
            self._files[key] = (self.logs_dir / f"{key}.log").open("a", buffering=1)
        return self._files[key]

    def note(self, text: str) -> None:
        """A message of the runner itself."""
        self._print(self.err, f"kube-ddp: {printable(text)}")

    def event(self, event: Event) -> None:
        self.note(f"{event.type} {event.reason}: {event.message}")

    def progress(self, line: str, elapsed_s: float) -> None:
        """On a terminal, the line with the time it has run; elsewhere, each new line once."""
        minutes, seconds = divmod(int(elapsed_s), 60)
        line = printable_line(line)
        with self._lock:
            if self.live:
                self._shown = f"{line}  {minutes}:{seconds:02d}"
                self.err.write("\r\033[K" + self._shown)
            elif line != self._last:
                self.err.write(f"{line}  {minutes}:{seconds:02d}\n")
                self._last = line
            self.err.flush()

    def _print(self, stream: TextIO, text: str) -> None:
        with self._lock:
            if self.live and self._shown:
                self.err.write("\r\033[K")
                self.err.flush()
            stream.write(text + "\n")
            stream.flush()
            if self.live and self._shown:
                self.err.write(self._shown)
                self.err.flush()

    def end_progress(self) -> None:
        with self._lock:
            if self.live and self._shown:
                self.err.write("\n")
                self.err.flush()
            self._shown = ""

    def close(self) -> None:
        self.end_progress()
        with self._lock:
            for file in self._files.values():
                file.close()
            self._files.clear()

    def summary(self, job_name: str, status: JobStatus, workers: list[WorkerRecord]) -> None:
        self.end_progress()
        training = status.training or TrainingProgress()
        condition = next(
            (c for c in status.conditions if c.type == status.phase and c.status == "True"), None
        )
        rows = [
            ("job", job_name),
            ("phase", status.phase or "-"),
            ("reason", condition.reason if condition and condition.reason else "-"),
            ("message", condition.message if condition and condition.message else "-"),
            ("restarts", str(status.restarts)),
            ("epochs", _fraction(training.epoch, training.epochs)),
            ("val-acc", _number(training.val_accuracy, ".4f")),
            ("best val-acc", _number(training.best_val_accuracy, ".4f")),
            ("images/s", _number(training.images_per_sec, ".0f")),
        ]
        if status.failure is not None and status.phase == "Failed":
            failure = status.failure
            rows.append(("failure", f"{failure.pod} exit {failure.exit_code} ({failure.reason})"))
        width = max(len(key) for key, _ in rows)
        lines = [f"{key:<{width}}  {value}" for key, value in rows]
        lines.append("")
        table = [("WORKER", "ATTEMPT", "PID", "EXIT", "REASON", "SECONDS")]
        for record in workers:
            table.append(
                (
                    record.pod,
                    str(record.attempt),
                    str(record.pid or "-"),
                    "-" if record.exit_code is None else str(record.exit_code),
                    ("stopped" if record.stopped else record.reason) or "-",
                    "-" if record.seconds is None else f"{record.seconds:.1f}",
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines += [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in table
        ]
        with self._lock:
            self.err.write("\n" + printable("\n".join(lines)) + "\n")
            self.err.flush()


def _fraction(done: int | None, planned: int | None) -> str:
    if done is None:
        return "-"
    return f"{done}/{planned}" if planned is not None else str(done)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
