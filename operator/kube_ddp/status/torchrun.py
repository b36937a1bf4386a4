"""`launcher: torchrun` (the default): kube-ddp creates the worker pods of each attempt itself,
restarts them as a group and cleans them up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kube_ddp import names
from kube_ddp.api import DDPTrainingJob, RunPolicy, WorkerCounts
from kube_ddp.reasons import PodReason, Reason
from kube_ddp.status.draft import CreateWorkers, Draft, Event
from kube_ddp.status.failures import (
    WorkerFailure,
    avoided_nodes,
    awaiting_the_cause,
    cause_first,
    fail_or_restart,
    force_delete_overdue,
    pod_failure,
)
from kube_ddp.status.inplace import (
    fold_rank_restart,
    go_on_replacing,
    replace,
    replaceable,
    restarting_in_place,
    taken_away_counts_as_preemption,
    taken_running,
)
from kube_ddp.status.lifecycle import (
    FINISHED,
    Stall,
    after_finish,
    count_workers,
    deadline_exceeded,
    finish,
    not_created,
    peers_grace_left,
    preempting,
    progress,
    progress_stalled,
    suspend,
)
from kube_ddp.status.views import MPIJobView, PodView


@dataclass(frozen=True)
class Pods:
    """The group as torchrun's launcher has it: the worker pods."""

    pods: Sequence[PodView]

    def stop(self, draft: Draft) -> None:
        draft.delete(self.pods)

    def clean_up(self, draft: Draft, policy: RunPolicy) -> None:
        if policy.clean_pod_policy == "None":
            return
        doomed = list(self.pods) if policy.clean_pod_policy == "All" else self.active
        left = peers_grace_left(draft.status, draft.now)
        if left > 0 and self.active:
            draft.requeue(left)
            doomed = [p for p in doomed if not p.active]
        draft.delete(doomed)

    @property
    def active(self) -> list[PodView]:
        return [p for p in self.pods if p.active]


def decide_torchrun(
    draft: Draft,
    job: DDPTrainingJob,
    observed: list[PodView],
    expected: Sequence[str],
    mpijob: MPIJobView | None,  # torchrun's path has none
    suspended_by: tuple[str, str] | None,
) -> None:
    status = draft.status
    attempt = status.current_attempt
    # Labels make no pod a worker: only pods a DDPTrainingJob controls count, this job's
    # (ours) or an earlier job's of the same name (stale, below); any other is left alone.
    observed = [p for p in observed if p.owner_kind == names.KIND]
    ours = [p for p in observed if p.owner_uid == job.metadata.uid]
    # The newest pod of a worker is the worker (at a tie, the active one): a lost pod's last
    # event may be read after its successor's first, kopf keeping a queue per object.
    newest_last = sorted(ours, key=lambda p: (p.created_at or "", p.active))
    current = {p.index: p for p in newest_last if p.attempt == attempt}
    expected = list(expected)
    for name in expected:
        index = names.worker_index(job.name, name)
        if index is None:
            continue
        known = current.get(index)
        # Created and not seen yet: the worker, unless a pod of that name is seen; a successor
        # (another name) stands for the worker while its lost predecessor goes.
        if known is None or (not known.active and known.name != name):
            current[index] = PodView(name=name, index=index, attempt=attempt, phase="Pending")
    # Pods of another attempt, or of an earlier job of the same name: the next attempt
    # reuses their names, so they must be gone before it starts.
    stale = [p for p in observed if p.attempt != attempt or p not in ours]
    count_workers(draft, job, current)
    force_delete_overdue(draft, observed)  # their node stopped reporting: they would block

    if status.phase in FINISHED:
        after_finish(draft, job, Pods(ours))
    elif job.spec.run_policy.suspend:
        suspend(draft, observed, suspended_by)
    elif (late := deadline_exceeded(draft, job)) is not None:
        draft.delete([p for p in observed if p.active])
        finish(draft, job, Pods(ours), "Failed", Reason.DEADLINE_EXCEEDED, late)
    elif stale:
        draft.delete(stale)
    elif not_created(status) and preempting(status):
        # The stopped group has this attempt's names and labels: the next starts once it is gone.
        if left := [p for p in ours if p.attempt == attempt]:
            draft.delete(left)
        else:
            _create(draft, job, attempt, list(range(job.spec.nodes)))
    elif not_created(status):
        if not any(p.deleting for p in current.values()):  # same names: let them go first
            missing = [i for i in range(job.spec.nodes) if i not in current]
            _create(draft, job, attempt, missing)
    elif (worker0 := current.get(0)) is not None and worker0.phase == "Succeeded":
        message = f"{worker0.name} completed"
        finish(draft, job, Pods(ours), "Succeeded", Reason.WORKER_SUCCEEDED, message)
    else:
        taken_names = {p.name for p in observed} | set(expected)
        _under_way(draft, job, current, ours, observed, taken_names)


def _under_way(
    draft: Draft,
    job: DDPTrainingJob,
    current: dict[int, PodView],
    ours: list[PodView],
    observed: list[PodView],
    taken_names: set[str],
) -> None:
    """A group created and not finished: count restarts in place, go on with replacements,
    then a new failure restarts the group or fails the job, or replaces a pod while the others
    go on; then progress."""
    if fold_rank_restart(draft, job, current, Pods(ours)):
        return
    go_on_replacing(draft, job, current, taken_names)
    replacing = set(draft.status.replacing)
    unseen_taken = taken_away_counts_as_preemption(job, current)
    failures = [*_failures(job, current, unseen_taken), *taken_running(job, current)]
    if failures := [f for f in failures if f.index not in replacing]:
        if (wait := awaiting_the_cause(failures, current.values(), draft.now)) is not None:
            draft.requeue(wait)
            return
        if not replaceable(job, failures, current):
            fail_or_restart(draft, job, failures, Pods(observed))
            return
        replace(draft, job, failures, current, Pods(ours), taken_names)
        if draft.status.phase in FINISHED:
            return
    nodes = job.spec.nodes
    running = sum(p.phase in ("Running", "Succeeded") for p in current.values())
    worker0 = current.get(0)
    enough = nodes if job.spec.elastic is None else job.spec.elastic.min_nodes
    up = None
    if running == nodes:
        up = f"All {nodes} workers are running"
    elif running >= enough and worker0 is not None and worker0.phase == "Running":
        up = f"{running} of {nodes} workers are running (elastic: at least {enough})"
    # Ranks restarted in place start again (import, rendezvous, a checkpoint's load) as a new
    # attempt does: the deadline waits for their first report.
    in_place = restarting_in_place(draft)
    if up is not None and not in_place and (stall := progress_stalled(draft, job, current)):
        fail_or_restart(draft, job, [_hung(job, stall)], Pods(observed))
        return
    progress(
        draft,
        job,
        current,
        running=running,
        up=up,
        reason=Reason.WORKERS_RUNNING,
        restarting=in_place,
    )


def _hung(job: DDPTrainingJob, stall: Stall) -> WorkerFailure:
    """The group's failure when rank 0 stopped reporting progress: the rank the trainer found
    the group waiting on, else worker 0 (the one that reports)."""
    suspect = stall.suspect
    if suspect is not None and suspect.pod:
        index = names.worker_index(job.name, suspect.pod)
        return WorkerFailure(
            pod=suspect.pod,
            index=0 if index is None else index,
            reason=Reason.PROGRESS_DEADLINE_EXCEEDED,
            message=stall.message,
            hung=True,
            node=suspect.node,
            rank=suspect.rank,
        )
    return WorkerFailure(
        pod=names.worker_name(job.name, 0),
        index=0,
        reason=Reason.PROGRESS_DEADLINE_EXCEEDED,
        message=stall.message,
        hung=True,
    )


def _create(draft: Draft, job: DDPTrainingJob, attempt: int, indices: list[int]) -> None:
    """Create the group for this attempt (first start, after a restart, or on resume)."""
    avoid = avoided_nodes(draft)
    draft.actions.append(CreateWorkers(attempt=attempt, indices=tuple(indices), avoid_nodes=avoid))
    if 0 in indices:  # a new group: its agents count their restarts in place from 0
        draft.update(in_place_restarts=0, replacing=[])
    workers = draft.status.workers or WorkerCounts()
    draft.update(workers=workers.model_copy(update={"pending": workers.pending + len(indices)}))
    if draft.status.start_time is None:
        draft.update(start_time=draft.now)
    resumed = draft.status.phase == "Suspended"
    if resumed:
        draft.condition("Suspended", "False", Reason.RESUMED, "The job was resumed")
    message = f"Created {job.spec.nodes} worker pods (attempt {attempt})"
    if draft.status.phase == "Pending":  # it waited for room: said, though the phase stays
        draft.events.append(Event("Normal", Reason.WORKERS_CREATED, message))
    draft.condition("Created", "True", Reason.WORKERS_CREATED, message)
    draft.phase("Pending", Reason.RESUMED if resumed else Reason.WORKERS_CREATED, message)


def _failures(
    job: DDPTrainingJob, current: Mapping[int, PodView], unseen_taken: bool = False
) -> list[WorkerFailure]:
    """Failed, lost or vanished workers of this attempt, the first one first; `unseen_taken`:
    a vanished worker other than worker 0 was taken while it ran (`inplace.
    taken_away_counts_as_preemption`)."""
    failures = []
    for index in range(job.spec.nodes):
        pod = current.get(index)
        if pod is None:
            vanished = WorkerFailure(
                pod=names.worker_name(job.name, index),
                index=index,
                reason=PodReason.DELETED,
                message="the pod was deleted",
                vanished=True,
                taken_running=unseen_taken and index > 0,
            )
            failures.append(vanished)
        elif failure := pod_failure(pod):
            failures.append(failure)
    return cause_first(failures)
