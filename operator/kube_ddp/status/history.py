"""`status.trainingHistory`: the run's curve, kept from rank 0's reports of each epoch's end.

`status.training` holds only the newest figures, and the trainer's merge patches replace them:
the curve is what the operator keeps of them, so `kube-ddp describe` can draw it from the job
alone. A point per epoch end (a report with step 0: a heartbeat within an epoch has step 1 or
more), at most `HISTORY_POINTS`: when full, every other point goes, the newest stays, and later
points keep the wider spacing (a curve evenly spread over the whole run, and the newest epoch
always in it). A resumed run trains again the epochs after its checkpoint: their points are
replaced, so the curve goes on as one line. A restart or a preemption is a mark where rank 0
had got to (epochs done, and a fraction for the steps into the next).

A report the operator did not see before the next one replaced it (epochs shorter than one
reconcile) leaves no point: the curve is a sample of the run, its figures are exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from kube_ddp.api import (
    HISTORY_MARKS,
    HISTORY_POINTS,
    CurveMark,
    EpochPoint,
    JobStatus,
    TrainingHistory,
    TrainingProgress,
)


def epoch_end(training: TrainingProgress | None) -> EpochPoint | None:
    """The point a report of an epoch's end makes; None for any other report."""
    if training is None or training.epoch is None or training.epoch < 1:
        return None
    if training.step not in (None, 0) or training.loss is None:
        return None
    return EpochPoint(
        epoch=training.epoch,
        loss=training.loss,
        val_loss=training.val_loss,
        val_accuracy=training.val_accuracy,
    )


def add_points(
    history: TrainingHistory | None, points: Iterable[EpochPoint], cap: int = HISTORY_POINTS
) -> TrainingHistory | None:
    """`history` with `points` added in turn (a point already last is not added again)."""
    kept = list(history.points) if history is not None else []
    for point in points:
        if kept and kept[-1] == point:
            continue
        kept = [p for p in kept if p.epoch < point.epoch]  # a resumed run trains them again
        if len(kept) >= 2 and kept[-1].epoch - kept[-2].epoch < _spacing(kept[:-1]):
            kept.pop()  # the newest stood for the epochs since the last one at the spacing
        kept.append(point)
        if len(kept) > cap:
            kept = [*kept[:-1][::2], kept[-1]]
    if history is None:
        return TrainingHistory(points=kept) if kept else None
    return history.model_copy(update={"points": kept})


def follow(before: JobStatus, after: JobStatus) -> TrainingHistory | None:
    """`after`'s history: the point of its training report if that is an epoch's end, and a
    mark for a restart or a preemption counted since `before`."""
    point = epoch_end(after.training)
    history = add_points(after.training_history, [point] if point else [])
    kinds = [
        kind
        for kind, counted in (
            ("Restart", after.restarts > before.restarts),
            ("Preemption", after.preemptions > before.preemptions),
        )
        if counted
    ]
    if not kinds:
        return history
    where = position(after.training)
    marks = [*(history.marks if history else []), *(CurveMark(epoch=where, kind=k) for k in kinds)]
    return (history or TrainingHistory()).model_copy(update={"marks": marks[-HISTORY_MARKS:]})


def position(training: TrainingProgress | None) -> float:
    """Epochs done by rank 0's newest report, and the fraction of the next its steps are."""
    if training is None or training.epoch is None:
        return 0.0
    steps, per_epoch = training.step or 0, training.steps_per_epoch
    fraction = min(steps / per_epoch, 0.99) if per_epoch else 0.0
    return round(training.epoch + fraction, 2)


def _spacing(points: list[EpochPoint]) -> int:
    """Epochs between the points kept so far (the smallest gap: a point missed widens one)."""
    gaps = [b.epoch - a.epoch for a, b in pairwise(points)]
    return max(1, min(gaps, default=1))
