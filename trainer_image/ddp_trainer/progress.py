"""What rank 0 shows: a progress bar on a terminal, one JSON line per epoch, the summary file;
and `report` and `report_checkpoint`, the progress of a program of the user's own."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import SupportsFloat, TextIO

from ddp_trainer import contract, culprit, tracking
from ddp_trainer.errors import exit_peer_lost, is_peer_lost, storage
from ddp_trainer.report import Heartbeat, StatusReporter, checkpoint_fields, now_utc


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
    first_epoch_seconds: float = 0.0  # training time of this run's first epoch: compile, warm-up
    peak_device_memory_mib: float | None = None  # torch's allocator peak on a GPU, else None


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


# --- progress from a program of the user's own -------------------------------------------------


def report(
    epoch: int,
    step: int,
    steps_per_epoch: int,
    loss: SupportsFloat | None = None,
    *,
    epochs: int,
) -> bool:
    """Tell kube-ddp where training stands, from a program of your own: call it after every
    step, `step` steps (1, 2, ... `steps_per_epoch`) into epoch `epoch` (0, 1, ...).

    Rank 0 sends the job's status.training (step, progressPercentage,
    estimatedRemainingSeconds, loss) at most every 30 s and at the end of each epoch, which is
    what runPolicy.progressDeadlineSeconds and `kubectl get ddpjobs` read; on every other rank,
    and outside kube-ddp, it does nothing. Under kube-ddp every rank also keeps its progress
    in the group's store (`ddp_trainer.culprit`): a collective that times out or a peer that
    goes away then ends the program with the trainer's own exit code, 88, which restarts the
    group, naming the rank that stopped first. `loss` (a float or a tensor) is read only when a
    report goes out, so passing a device tensor costs no sync per step. Standard library only;
    a failed report is a warning and never stops training. True when a report was accepted.

        from ddp_trainer.progress import report
        report(epoch, step + 1, len(loader), loss, epochs=epochs)
    """
    ledger = _watch_peers()
    if ledger is not None:
        ledger.step = epoch * steps_per_epoch + step
    heartbeat = _heartbeat(epochs, steps_per_epoch)
    if heartbeat is None:
        return False
    if ledger is not None and not ledger.watching:
        ledger.watch(heartbeat.world_size, heartbeat.report_stall)
    if step < steps_per_epoch:
        return heartbeat.beat(epoch, step, loss)
    # The epoch's end: reported whenever it comes, as the trainer reports its epochs.
    return heartbeat.send(epoch + 1, 0, loss, final=epoch + 1 >= epochs)


def report_checkpoint(step: int, epoch: int, seconds: float, *, resumed_from_step: int = 0) -> bool:
    """Tell kube-ddp that rank 0 saved a checkpoint after global step `step` (in epoch
    `epoch`, taking `seconds`), and from which step this run resumed (0: a fresh start): the
    job's status.training.checkpoint and resumedFromStep, as the trainer reports them. On
    other ranks and outside kube-ddp it does nothing; True when a report was accepted."""
    reporter = _reporter()
    if reporter is None:
        return False
    fields = checkpoint_fields(
        step=step,
        epoch=epoch,
        saved_at=now_utc(),
        seconds=seconds,
        resumed_from_step=resumed_from_step,
    )
    return reporter.report({"status": {"training": fields}})


def log_metrics(
    step: int,
    values: Mapping[str, SupportsFloat],
    *,
    log_dir: str | None = None,
    resumed_from_step: int = 0,
    params: Mapping[str, object] | None = None,
) -> None:
    """Training curves from a program of your own, as the trainer writes them: `values` (floats
    or tensors, read here) at global step `step`, from rank 0, to TensorBoard event files in
    `log_dir` (a directory or s3://BUCKET/PREFIX) and to MLflow when MLFLOW_TRACKING_URI is
    set. Call it every N steps and after each epoch, with the step your checkpoint resumed
    from (0: a fresh start): TensorBoard then shows a resumed run as the same curves, and
    MLflow continues the job's run. `params` go to a new MLflow run. Rank 0 of the process
    group (or of RANK before there is one) writes; elsewhere, or with neither a `log_dir` nor
    a tracking server, it does nothing. Needs ddp-trainer[tracking]; a failure is a warning
    and never stops training.

        from ddp_trainer.progress import log_metrics
        log_metrics(step, {"train/loss": loss}, log_dir=args.log_dir, resumed_from_step=done)
    """
    if "tracker" not in _TRACKER:  # the first call opens it
        rank_0 = _rank() == 0
        _TRACKER["tracker"] = (
            tracking.open_tracker(
                log_dir, os.environ, first_step=resumed_from_step + 1, params=params or {}
            )
            if rank_0
            else None
        )
    tracker = _TRACKER["tracker"]
    if tracker is not None:
        tracker.log(step, values)
        tracker.flush()


_TRACKER: dict[str, tracking.Tracker | None] = {}


def _rank() -> int:
    """The process group's rank once there is one (mpirun sets no RANK), else RANK's."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get(contract.RANK) or 0)


@functools.cache
def _reporter() -> StatusReporter | None:
    """Rank 0's reporter of a job kube-ddp runs, else None."""
    if os.environ.get(contract.RANK, "0") != "0":
        return None
    return StatusReporter.from_env(os.environ)


@functools.cache
def _heartbeat(epochs: int, steps_per_epoch: int) -> Heartbeat | None:
    """This process's heartbeat, made on the first report (None: not rank 0 of a job kube-ddp
    runs)."""
    reporter = _reporter()
    if reporter is None:
        return None
    every = Heartbeat.every_from_env(os.environ)
    world_size = int(os.environ.get(contract.WORLD_SIZE) or 1)
    return Heartbeat(
        reporter,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        world_size=world_size,
        every=every,
    )


_PEER_WATCH: dict[str, culprit.Ledger] = {}


def _watch_peers() -> culprit.Ledger | None:
    """On each rank of a job kube-ddp runs, once its process group is up: this rank's ledger,
    and an exception hook that turns a lost peer into the trainer's exit, 88."""
    if "ledger" in _PEER_WATCH or not os.environ.get(contract.JOB_NAME):
        return _PEER_WATCH.get("ledger")
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return None
    ledger = _PEER_WATCH["ledger"] = culprit.start_ledger(dist.get_rank(), os.environ)
    uncaught = sys.excepthook

    def peer_lost_exits_88(
        kind: type[BaseException], exc: BaseException, trace: TracebackType | None
    ) -> None:
        if not is_peer_lost(exc):
            uncaught(kind, exc, trace)
            return
        traceback.print_exception(kind, exc, trace, file=sys.stderr)
        print(culprit.name_the_culprit(ledger, dist.get_world_size()), file=sys.stderr)
        exit_peer_lost(f"rank {dist.get_rank()}", exc)

    sys.excepthook = peer_lost_exits_88
    return ledger
