"""Restarts in place (`runPolicy.restartStrategy: InPlace`, docs/design.md "Failure rules"): the
pods' agents restart their ranks and say so in `status.rankRestart`, which is counted here; a
lost worker other than worker 0 is the only pod replaced, under the same attempt, by a successor
created at once under a name of its own (`names.successor_name`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

from kube_ddp import names
from kube_ddp.api import DDPTrainingJob, Failure
from kube_ddp.reasons import PodReason, Reason
from kube_ddp.status.draft import CreateWorkers, Draft, Event
from kube_ddp.status.failures import (
    WorkerFailure,
    avoid_lost_nodes,
    avoided_nodes,
    failure_of,
    is_retryable,
    node_lost,
    preempted_by,
)
from kube_ddp.status.lifecycle import Group, finish, record_preemption
from kube_ddp.status.views import PodView


def fold_rank_restart(
    draft: Draft, job: DDPTrainingJob, workers: Mapping[int, PodView], group: Group
) -> bool:
    """Count the restarts in place the agents of this group reported and that are not counted
    yet (each once: `inPlaceRestarts` holds the agents' count already in `restarts`); True when
    they passed backoffLimit and the job failed. A report older than worker 0's pod belongs to
    an earlier group of the same attempt (one stopped for a preemption)."""
    status, report = draft.status, draft.status.rank_restart
    worker0 = workers.get(0)
    if report is None or report.count is None or report.attempt != status.current_attempt:
        return False
    if worker0 is None or worker0.created_at is None or report.time is None:
        return False
    if report.time < datetime.fromisoformat(worker0.created_at):
        return False
    new = report.count - status.in_place_restarts
    if new <= 0:
        return False
    restarts, limit = status.restarts + new, job.spec.run_policy.backoff_limit
    said = f"rank {report.rank} (pod {report.pod}) exited with code {report.exit_code}"
    if report.message:
        said += f" ({report.message})"
    failure = Failure(
        pod=report.pod,
        exit_code=report.exit_code,
        reason=Reason.RESTARTED_IN_PLACE,
        message=report.message or "",
    )
    draft.update(restarts=restarts, in_place_restarts=report.count, failure=failure)
    if restarts > limit:
        message = f"{said}; restarted in place, and backoffLimit {limit} is reached"
        finish(draft, job, group, "Failed", Reason.BACKOFF_LIMIT_EXCEEDED, message)
        return True
    message = (
        f"{said}; its agent restarted the ranks in place, every pod kept "
        f"(restart {restarts} of at most {limit})"
    )
    draft.events.append(Event("Warning", Reason.RESTARTED_IN_PLACE, message))
    draft.condition("Restarting", "True", Reason.RESTARTED_IN_PLACE, message)
    return False


def restarting_in_place(draft: Draft) -> bool:
    """Ranks restarted in place have not reported progress since (their first report ends the
    restart): the Restarting condition stays. A job whose program never reports has none."""
    status = draft.status
    training, report = status.training, status.rank_restart
    if status.in_place_restarts == 0 or report is None or report.time is None:
        return False
    if training is None or training.updated_at is None:
        return False
    return training.updated_at < report.time


def replaceable(
    job: DDPTrainingJob, failures: list[WorkerFailure], workers: Mapping[int, PodView]
) -> bool:
    """Whether the failed workers are replaced alone: the job restarts in place, worker 0 (whose
    agent holds the rendezvous) still runs and not on a node taken for lost (its own eviction
    is on the way), and every failure is another worker's loss, a retryable end of its agent,
    or a preemption (it saved on SIGTERM)."""
    worker0 = workers.get(0)
    if not job.spec.restarts_in_place or worker0 is None or not worker0.active:
        return False
    lost = [workers.get(f.index) for f in failures if f.reason == PodReason.NODE_LOST]
    lost_nodes = {pod.node for pod in lost if pod is not None}
    if worker0.node is not None and worker0.node in lost_nodes:
        return False
    return all(
        f.index > 0 and not f.hung and (f.preempted or is_retryable(job, f)) for f in failures
    )


def taken_away_counts_as_preemption(job: DDPTrainingJob, workers: Mapping[int, PodView]) -> bool:
    """Whether a worker other than worker 0 taken away before it ended is replaced alone as a
    preemption: the job restarts in place, its worker 0 runs, and restartPolicy is not Never
    (where how the worker ends decides between replacing it and failing the job). Also a
    worker gone before any look saw it end (removed while no operator watched: a takeover, an
    API server outage): only a deletion removes a pod, most likely of one still running, and
    a count that hung on whether an operator was watching would not be a count."""
    return job.spec.run_policy.restart_policy != "Never" and replaceable(job, [], workers)


def taken_running(job: DDPTrainingJob, workers: Mapping[int, PodView]) -> list[WorkerFailure]:
    """Workers other than worker 0 whose pods are being deleted while they still run (a
    person, a drain, the scheduler's preemption), in a job that restarts in place whose
    worker 0 runs: replaced at once, while the ranks still save, and so preemptions however
    they end (`WorkerFailure.taken_running`), where `taken_away_counts_as_preemption`."""
    if not taken_away_counts_as_preemption(job, workers):
        return []
    return [
        WorkerFailure(
            pod=pod.name,
            index=index,
            reason=preempted_by(pod),
            message=pod.message or "",
            taken_running=True,
        )
        for index, pod in sorted(workers.items())
        if index > 0
        and pod.deleting
        and pod.phase in ("Pending", "Running")
        and node_lost(pod) is None
    ]


def replace(
    draft: Draft,
    job: DDPTrainingJob,
    failures: list[WorkerFailure],
    workers: Mapping[int, PodView],
    group: Group,
    taken_names: Collection[str],
) -> None:
    """Replace each failed worker alone, under the same attempt, while its peers wait in the
    rendezvous: a preemption where it saved on SIGTERM (or is being taken away while it runs),
    else a restart (`WorkerReplaced`), or Failed once backoffLimit is reached."""
    limit = job.spec.run_policy.backoff_limit
    counted = [f for f in failures if not f.preempted]
    if counted and draft.status.restarts + len(counted) > limit:
        first = counted[0]
        if len(counted) == 1:
            message = f"{first.describe()}; backoffLimit {limit} reached"
        else:  # "reached" would read wrong at fewer restarts than the limit
            message = (
                f"{first.describe()}, with {len(counted) - 1} more worker(s) at once; "
                f"replacing them all would pass backoffLimit {limit} "
                f"({draft.status.restarts} restart(s) so far)"
            )
        draft.update(failure=failure_of(first))
        finish(draft, job, group, "Failed", Reason.BACKOFF_LIMIT_EXCEEDED, message)
        return
    for failure in failures:
        if failure.preempted:
            detail = f": {failure.message}" if failure.message else ""
            record_preemption(draft, failure.reason, f"{failure.pod}{detail}")
            message = (
                f"{failure.describe()}; preempted ({failure.reason}), replacing that pod alone "
                f"(preemption {draft.status.preemptions}, not counted as a restart)"
            )
            draft.events.append(Event("Normal", Reason.PREEMPTED, message))
            continue
        restarts = draft.status.restarts + 1
        message = (
            f"{failure.describe()}; replacing that pod alone, its peers wait for it "
            f"(restart {restarts} of at most {limit})"
        ) + avoid_lost_nodes(draft, job, [failure])
        draft.update(restarts=restarts, failure=failure_of(failure))
        draft.events.append(Event("Warning", Reason.WORKER_REPLACED, message))
        draft.condition("Restarting", "True", Reason.WORKER_REPLACED, message)
    new = sorted({f.index for f in failures})
    draft.update(replacing=sorted({*draft.status.replacing, *new}))
    go_on_replacing(draft, job, workers, taken_names, new)


def go_on_replacing(
    draft: Draft,
    job: DDPTrainingJob,
    workers: Mapping[int, PodView],
    taken_names: Collection[str],
    indices: Collection[int] | None = None,
) -> None:
    """The next step of each replacement under way (those of `indices`, when given): delete
    the lost pod and create its successor at once, under the first name no pod of the job
    holds (`taken_names`: the lost one may hold its name for a while: a save on SIGTERM, a
    kubelet yet to confirm); forget the replacement once the successor is there. Only
    workers 1..nodes-1 are ever replaced alone: another index read from the status was not
    the operator's (status/trust.py) and is dropped."""
    replaceable = range(1, job.spec.nodes)
    under_way = [i for i in draft.status.replacing if i in replaceable]
    chosen = under_way if indices is None else [i for i in indices if i in replaceable]
    left, successors, doomed = [], {}, []
    for index in chosen:
        pod = workers.get(index)
        if pod is None or (not pod.active and pod.phase != "Succeeded"):
            if pod is not None:  # the lost one, going or to go
                doomed.append(pod)
            successors[index] = _free_name(job, index, taken_names)
            left.append(index)
    draft.delete(doomed)
    if successors:
        draft.actions.append(
            CreateWorkers(
                attempt=draft.status.current_attempt,
                indices=tuple(successors),
                pod_names=tuple(successors.values()),
                avoid_nodes=avoided_nodes(draft),
            )
        )
    others = [i for i in under_way if i not in chosen]
    draft.update(replacing=sorted({*others, *left}))


def _free_name(job: DDPTrainingJob, index: int, taken_names: Collection[str]) -> str:
    generation = 0
    while (name := names.successor_name(job.name, index, generation)) in taken_names:
        generation += 1
    return name
