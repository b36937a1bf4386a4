"""Training curves where people look, written by rank 0: TensorBoard event files in a
directory or an object store (`--log-dir`, `ddp_trainer.event_files`) and an MLflow run when
the environment names a tracking server (`MLFLOW_TRACKING_URI`, `ddp_trainer.mlflow_run`).

Both are optional: their packages (the trainer's `tracking` extra) are imported only when a
run asks for them, and a run that asks for neither opens no tracker. A resumed process
continues the same curves: its first step is the one after the checkpoint it resumed from,
which TensorBoard purges from and MLflow continues the job's run at.

A tracker never stops training: a writer that fails says so once and is dropped, as a failed
status report is. `close_open` ends whatever is still open as the process ends
(`errors.end_process`), so a program of the user's own that exits 86 on SIGTERM keeps its
last events too.
"""

from __future__ import annotations

import atexit
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Protocol, SupportsFloat

from ddp_trainer import errors
from ddp_trainer.contract import EXIT_PREEMPTED
from ddp_trainer.report import as_number

log = logging.getLogger(__name__)

INSTALL_HINT = "install ddp-trainer[tracking] (tensorboard, mlflow-skinny)"


class Writer(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def flush(self, wait: bool = False) -> None: ...

    def close(self, outcome: str, checkpoint: str | None) -> None: ...


class Tracker:
    """Scalars by step to every writer that works; `close` once, with the run's outcome."""

    def __init__(self, events: Writer | None, mlflow: Writer | None) -> None:
        self.events = events
        self.mlflow = mlflow
        self.closed = False
        _OPEN.append(self)

    def log(self, step: int, values: Mapping[str, SupportsFloat]) -> None:
        """`values` may be tensors: each is read (a device sync) here."""
        floats = {key: as_number(value) for key, value in values.items()}
        for name in ("events", "mlflow"):
            self._call(name, lambda writer: writer.log(step, floats))

    def flush(self, wait: bool = False) -> None:
        for name in ("events", "mlflow"):
            self._call(name, lambda writer: writer.flush(wait))

    def close(self, outcome: str, checkpoint: str | None = None) -> None:
        """`outcome`: finished, failed or stopped (SIGTERM); `checkpoint`: the newest one's
        location, for the MLflow run's tags."""
        if self.closed:
            return
        self.closed = True
        _OPEN.remove(self)
        for name in ("events", "mlflow"):
            self._call(name, lambda writer: writer.close(outcome, checkpoint))

    def _call(self, name: str, action: Callable[[Writer], None]) -> None:
        writer = getattr(self, name)
        if writer is None:
            return
        try:
            action(writer)
        except Exception as exc:  # a tracker never stops training
            log.warning("%s: %s: no more curves there for this process", name, exc)
            setattr(self, name, None)


def open_tracker(
    log_dir: str | None,
    env: Mapping[str, str],
    *,
    first_step: int,
    params: Mapping[str, object],
) -> Tracker | None:
    """Rank 0's tracker: TensorBoard with `log_dir`, MLflow with MLFLOW_TRACKING_URI; None
    when neither is asked for. `first_step`: the first global step this process trains (1
    for a fresh start)."""
    from ddp_trainer.mlflow_run import TRACKING_URI_ENV

    events = mlflow = None
    if log_dir:
        try:
            from ddp_trainer.event_files import EventFiles

            events = EventFiles(log_dir, purge_step=first_step)
        except ImportError as exc:
            log.warning("not writing TensorBoard events to %s: %s; %s", log_dir, exc, INSTALL_HINT)
        except Exception as exc:
            log.warning("not writing TensorBoard events to %s: %s", log_dir, exc)
    if env.get(TRACKING_URI_ENV):
        try:
            from ddp_trainer.mlflow_run import MlflowRun

            mlflow = MlflowRun.open(env, params=params, resumed=first_step > 1)
        except ImportError as exc:
            log.warning("not logging to MLflow: %s; %s", exc, INSTALL_HINT)
        except Exception as exc:
            log.warning("not logging to MLflow at %s: %s", env[TRACKING_URI_ENV], exc)
    if events is None and mlflow is None:
        return None
    return Tracker(events, mlflow)


_OPEN: list[Tracker] = []


def close_open(exit_code: int) -> None:
    """End every tracker still open, as a process exiting `exit_code` ends."""
    outcome = {0: "finished", EXIT_PREEMPTED: "stopped"}.get(exit_code, "failed")
    for tracker in list(_OPEN):
        tracker.close(outcome)


def _at_exit() -> None:
    """A script that returns from its main: finished, unless an exception ended it."""
    close_open(1 if hasattr(sys, "last_value") else 0)


atexit.register(_at_exit)
errors.before_exit(close_open)
