"""status.trainingHistory: the curve the operator keeps from rank 0's epoch-end reports, bounded
and thinned, a resumed run one line, restarts and preemptions marked (status/history.py)."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

from kube_ddp.api import HISTORY_POINTS, EpochPoint, JobStatus, TrainingProgress
from kube_ddp.status import decide
from kube_ddp.status.history import add_points, epoch_end, follow, position
from tests.unit.test_status import NOW, job, pod, running
from tests.unit.test_status_preemption import saved


def point(epoch: int, loss: float | None = None) -> EpochPoint:
    return EpochPoint(epoch=epoch, loss=1 / epoch if loss is None else loss, val_accuracy=0.5)


def epoch_report(epoch: int, loss: float = 0.5, **fields: Any) -> dict[str, Any]:
    """status.training as rank 0's report of epoch `epoch`'s end leaves it."""
    return {
        "epoch": epoch,
        "epochs": 500,
        "step": 0,
        "stepsPerEpoch": 10,
        "loss": loss,
        "valLoss": loss + 0.1,
        "valAccuracy": 0.9,
        **fields,
    }


def epochs_of(history: Any) -> list[int]:
    return [p.epoch for p in history.points]


def test_an_epoch_end_is_a_point_and_a_heartbeat_is_not() -> None:
    end = TrainingProgress.model_validate(epoch_report(3, loss=0.25))
    assert epoch_end(end) == EpochPoint(epoch=3, loss=0.25, val_loss=0.35, val_accuracy=0.9)
    heartbeat = TrainingProgress.model_validate(epoch_report(3, step=4))
    assert epoch_end(heartbeat) is None
    # a program of the user's own reports an epoch's end without validation figures
    own = TrainingProgress.model_validate({"epoch": 2, "step": 0, "loss": 0.7})
    assert epoch_end(own) == EpochPoint(epoch=2, loss=0.7)
    assert epoch_end(TrainingProgress.model_validate({"epoch": 0, "step": 0, "loss": 1})) is None
    assert epoch_end(None) is None


def test_points_are_appended_once_each() -> None:
    history = add_points(None, [point(1), point(2)])
    assert history is not None and epochs_of(history) == [1, 2]
    again = add_points(history, [point(2)])  # the same report, seen by the next reconcile
    assert again == history
    assert add_points(None, []) is None


def test_a_resumed_run_replaces_the_epochs_it_trains_again() -> None:
    history = add_points(None, [point(e) for e in range(1, 6)])
    resumed = add_points(history, [point(4, loss=0.3)])  # from the checkpoint of epoch 3
    assert resumed is not None
    assert epochs_of(resumed) == [1, 2, 3, 4]
    assert resumed.points[-1].loss == 0.3


def test_a_full_history_keeps_every_other_point_and_the_newest() -> None:
    history = add_points(None, [point(e) for e in range(1, HISTORY_POINTS + 1)])
    assert history is not None and len(history.points) == HISTORY_POINTS
    thinned = add_points(history, [point(HISTORY_POINTS + 1)])
    assert thinned is not None
    assert epochs_of(thinned) == [*range(1, HISTORY_POINTS + 1, 2), HISTORY_POINTS + 1]


def test_a_long_run_stays_bounded_and_evenly_spread() -> None:
    history = add_points(None, [point(e) for e in range(1, 1001)])
    assert history is not None
    epochs = epochs_of(history)
    assert len(epochs) <= HISTORY_POINTS
    assert epochs[0] == 1 and epochs[-1] == 1000  # the first epoch and the newest
    gaps = {b - a for a, b in pairwise(epochs[:-1])}
    assert len(gaps) == 1, gaps  # one spacing, but for the newest point
    assert len(json.dumps(history.model_dump(mode="json", by_alias=True))) < 10_000


def test_a_restart_and_a_preemption_are_marked_where_rank_0_was() -> None:
    training = TrainingProgress.model_validate(epoch_report(3, step=5))
    before = JobStatus(training=training)
    restarted = before.model_copy(update={"restarts": 1})
    history = follow(before, restarted)
    assert history is not None
    assert [(m.epoch, m.kind) for m in history.marks] == [(3.5, "Restart")]
    preempted = restarted.model_copy(update={"training_history": history, "preemptions": 1})
    history = follow(restarted, preempted)
    assert history is not None
    assert [(m.epoch, m.kind) for m in history.marks] == [(3.5, "Restart"), (3.5, "Preemption")]
    # the next reconcile reads the status written: nothing more is marked
    written = preempted.model_copy(update={"training_history": history})
    assert follow(written, written) == history
    assert position(None) == 0.0


def test_decide_keeps_the_curve_of_rank_0s_reports() -> None:
    history = add_points(None, [point(1), point(2)])
    assert history is not None
    status = running(training=epoch_report(3), trainingHistory=history.model_dump(by_alias=True))
    decision = decide(job(status), [pod(0), pod(1)], NOW)
    kept = decision.status.training_history
    assert kept is not None and epochs_of(kept) == [1, 2, 3]
    assert not kept.marks


def test_decide_marks_a_preemption_on_the_curve() -> None:
    status = running(training=epoch_report(7, step=2))
    decision = decide(job(status), [pod(0), saved(1, reason="PreemptionByScheduler")], NOW)
    assert decision.status.preemptions == 1
    kept = decision.status.training_history
    assert kept is not None
    assert [(m.epoch, m.kind) for m in kept.marks] == [(7.2, "Preemption")]
