"""A job's life that both launchers share: progress to Running, suspend, the deadline, the end
(its conditions, cleanPodPolicy through the launcher's `Group`, ttlSecondsAfterFinished)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Protocol

from kube_ddp import gang, names
from kube_ddp.api import (
    DDPTrainingJob,
    JobStatus,
    Phase,
    Preemption,
    RunPolicy,
    StallCheck,
    TrainingProgress,
    WorkerCounts,
)
from kube_ddp.reasons import Reason
from kube_ddp.status.draft import DeleteJob, Draft, Event, condition_status
from kube_ddp.status.views import PodView, creating_for, mount_failure

FINISHED: tuple[Phase, ...] = ("Succeeded", "Failed")
# Phases in which a group is under way: a suspend then is a preemption.
UNDER_WAY: tuple[Phase | None, ...] = ("Pending", "Starting", "Running")
# Phases in which the pods of the current attempt have not all been created yet.
NOT_CREATED: tuple[Phase | None, ...] = (None, "Restarting", "Suspended")
# Worker 0 of a group that succeeded may end a moment before its peers, which are past the
# same last step: cleanPodPolicy removes a peer still running only once this has passed.
PEERS_END_GRACE = timedelta(seconds=10)


def not_created(status: JobStatus) -> bool:
    """The pods of the current attempt are still to be created: a phase of `NOT_CREATED`, or
    `Created=False` (a full quota refused the group: `refusals.refuse`)."""
    return status.phase in NOT_CREATED or condition_status(status, "Created") == "False"


def peers_grace_left(status: JobStatus, now: datetime) -> float:
    """Seconds the peers still running after their group succeeded have left to end by
    themselves (`PEERS_END_GRACE`); 0 for a job that failed or is not finished."""
    if status.phase != "Succeeded" or status.completion_time is None:
        return 0.0
    elapsed = (now - status.completion_time).total_seconds()
    return max(PEERS_END_GRACE.total_seconds() - elapsed, 0.0)


def preempting(status: JobStatus) -> bool:
    """The group stopped for a preemption and is to start again under the same attempt (its
    pods' names and labels): the stopped pods must be gone first."""
    return status.phase == "Restarting" and any(
        c.type == "Restarting" and c.reason == Reason.PREEMPTED for c in status.conditions
    )


def record_preemption(draft: Draft, reason: str, message: str) -> None:
    """Count a preemption and say it in `lastPreemption`, with the newest checkpoint's step."""
    training = draft.status.training
    checkpoint = training.checkpoint if training else None
    preemption = Preemption(
        time=draft.now,
        reason=reason,
        message=message,
        checkpoint_step=checkpoint.step if checkpoint else None,
    )
    draft.update(preemptions=draft.status.preemptions + 1, last_preemption=preemption)


def note_resumed_step(draft: Draft, workers: Mapping[int, PodView]) -> None:
    """Copy the step the attempt after the last preemption resumed from into `lastPreemption`
    from the trainer's reports of that attempt (newer than its newest pod). The trainer's
    reports are merge patches: until the attempt sends `resumedFromStep` itself, the field may
    hold the one before's, so the copy follows the field while the attempt runs."""
    last, training = draft.status.last_preemption, draft.status.training
    if last is None or last.time is None:
        return
    if training is None or training.resumed_from_step is None or training.updated_at is None:
        return
    created = [datetime.fromisoformat(p.created_at) for p in workers.values() if p.created_at]
    # creationTimestamp has whole seconds: a pod of the same second as the preemption is newer
    if not created or min(created) < last.time.replace(microsecond=0):
        return
    if training.updated_at >= max(created) and last.resumed_from_step != training.resumed_from_step:
        resumed = last.model_copy(update={"resumed_from_step": training.resumed_from_step})
        draft.update(last_preemption=resumed)


class Group(Protocol):
    """One attempt's running part as its launcher makes it: the worker pods (torchrun) or the
    MPIJob (mpi)."""

    def stop(self, draft: Draft) -> None:
        """Remove the attempt before the group restarts."""

    def clean_up(self, draft: Draft, policy: RunPolicy) -> None:
        """What is left of it once the job has finished (cleanPodPolicy)."""


def count_workers(draft: Draft, job: DDPTrainingJob, workers: Mapping[int, PodView]) -> None:
    by_phase = [p.phase for p in workers.values()]
    draft.update(
        workers=WorkerCounts(
            total=job.spec.nodes,
            pending=by_phase.count("Pending"),
            running=by_phase.count("Running"),
            succeeded=by_phase.count("Succeeded"),
            failed=by_phase.count("Failed") + by_phase.count("Unknown"),
        )
    )


def progress(
    draft: Draft,
    job: DDPTrainingJob,
    workers: Mapping[int, PodView],
    *,
    running: int,
    up: str | None,
    reason: Reason,
    starting_note: str = "",
    restarting: bool = False,
) -> None:
    """Pending until every worker is placed, Starting until the group runs, then Running.

    `running` counts the workers that run; `up` says how the group runs (None while it does
    not yet), with `reason`; `starting_note` tells what Starting still waits for; `restarting`:
    ranks restarted in place have not reported progress yet (Restarting stays True).
    """
    nodes = job.spec.nodes
    ordered = sorted(workers.values(), key=lambda p: p.index)
    note_resumed_step(draft, workers)
    _schedulable(draft, ordered, nodes, gang.describe(job))
    _containers_started(draft, ordered)
    if up is not None:
        draft.condition("Running", "True", reason, up)
        if condition_status(draft.status, "Restarting") == "True" and not restarting:
            draft.condition("Restarting", "False", reason, up)
        draft.phase("Running", reason, up)
        _straggler(draft, ordered)
    elif all(i in workers for i in range(nodes)) and all(p.scheduled for p in ordered):
        draft.phase(
            "Starting", Reason.WORKERS_STARTING, f"{running}/{nodes} workers running{starting_note}"
        )
    else:
        placed = sum(p.scheduled for p in ordered)
        draft.phase("Pending", Reason.WORKERS_PENDING, f"{placed}/{nodes} workers scheduled")


def _straggler(draft: Draft, workers: list[PodView]) -> None:
    """Straggler=True naming the rank rank 0 of the trainer found the group waiting for at
    every step, with a Warning Event; False again, with an Event, once it is one no more. A
    finding from before the newest worker was created is an earlier group's."""
    training = draft.status.training
    found = None if training is None else training.straggler
    created = [datetime.fromisoformat(p.created_at) for p in workers if p.created_at]
    if found is not None and (
        found.checked_at is None or (created and found.checked_at < max(created))
    ):
        found = None
    said = next((c for c in draft.status.conditions if c.type == "Straggler"), None)
    if found is not None and found.message:
        if said is None or said.status != "True" or said.message != found.message:
            draft.condition("Straggler", "True", Reason.STRAGGLER_DETECTED, found.message)
            draft.events.append(Event("Warning", Reason.STRAGGLER_DETECTED, found.message))
    elif said is not None and said.status == "True":
        ratio = names.STRAGGLER_RATIO
        message = f"no rank is slower than {ratio}x the median of the others any more"
        draft.condition("Straggler", "False", Reason.STRAGGLER_RECOVERED, message)
        draft.events.append(Event("Normal", Reason.STRAGGLER_RECOVERED, message))


def _containers_started(draft: Draft, workers: list[PodView]) -> None:
    """ContainersStarted=False naming the first worker whose container the kubelet cannot
    start or whose volume it cannot mount, in the kubelet's words (it keeps retrying: a pull
    may come through, a Secret may be made); True again once none is stuck. A worker still
    creating its containers brings the job back when its FailedMount Events are due a look."""
    stuck = [
        (p, words, reason)
        for p in workers
        for words, reason in (
            (p.cannot_start, Reason.CONTAINER_CANNOT_START),
            (p.cannot_mount and mount_failure(p.cannot_mount), Reason.VOLUME_CANNOT_MOUNT),
        )
        if words
    ]
    was = condition_status(draft.status, "ContainersStarted")
    if stuck:
        pod, words, reason = stuck[0]
        message = f"{pod.name}: {words}"
        if was != "False":
            draft.events.append(Event("Warning", reason, message))
        draft.condition("ContainersStarted", "False", reason, message)
    elif was == "False":
        message = "No worker's container is waiting on the kubelet any more"
        draft.condition("ContainersStarted", "True", Reason.CONTAINERS_STARTED, message)
    for pod in workers:
        seconds = creating_for(pod, draft.now)
        if seconds is not None:
            due = names.MOUNT_LOOK_AFTER_SECONDS - seconds
            draft.requeue(due if due > 0 else names.MOUNT_RELOOK_SECONDS)


def _schedulable(draft: Draft, workers: list[PodView], nodes: int, group: str | None) -> None:
    """Schedulable=False naming the first worker the scheduler cannot place (and its gang,
    `group`); True once all `nodes` are placed."""
    stuck = [p for p in workers if p.unschedulable]
    if stuck:
        message = f"{stuck[0].name}: {stuck[0].unschedulable}"
        if group is not None:
            message = f"{group}: {message}"
        if condition_status(draft.status, "Schedulable") != "False":
            draft.events.append(Event("Warning", Reason.UNSCHEDULABLE, message))
        draft.condition("Schedulable", "False", Reason.UNSCHEDULABLE, message)
    elif len(workers) == nodes and all(p.scheduled for p in workers):
        draft.condition("Schedulable", "True", Reason.SCHEDULED, "All worker pods are scheduled")


def suspend(draft: Draft, pods: list[PodView], why: tuple[str, str] | None = None) -> None:
    """Suspended: no pods, the job kept; resuming recreates them without counting a restart.
    A group under way that is suspended (by the user, or by a queue) is preempted: counted in
    `preemptions`, its workers given the grace period to save."""
    draft.delete(pods)
    reason, message = why or (
        Reason.SUSPENDED,
        "The job is suspended (runPolicy.suspend): its pods are removed",
    )
    if draft.status.phase in UNDER_WAY:
        record_preemption(draft, reason, message)
    draft.condition("Suspended", "True", reason, message)
    if condition_status(draft.status, "Running") == "True":
        draft.condition("Running", "False", reason, message)
    draft.phase("Suspended", reason, message)


def deadline_exceeded(draft: Draft, job: DDPTrainingJob) -> str | None:
    """Why the job must fail if activeDeadlineSeconds has passed; else None, and a requeue for
    when it will."""
    deadline = job.spec.run_policy.active_deadline_seconds
    started = draft.status.start_time
    if deadline is None or started is None:
        return None
    left = deadline - (draft.now - started).total_seconds()
    if left > 0:
        draft.requeue(left)
        return None
    return f"The job ran longer than activeDeadlineSeconds ({deadline}s)"


@dataclass(frozen=True)
class Stall:
    """Why a running group must restart for want of progress, and the rank it waited on where
    the trainer found one."""

    message: str
    suspect: StallCheck | None = None


def progress_deadline(job: DDPTrainingJob, training: TrainingProgress) -> tuple[int, str] | None:
    """The seconds without a report of rank 0 that mean a hang, and where they come from:
    runPolicy.progressDeadlineSeconds, else learned from the job's own reports once an epoch
    ended (`names.LEARNED_DEADLINE_FACTOR` times the longest gap between two); None before."""
    own = job.spec.run_policy.progress_deadline_seconds
    if own is not None:
        return own, f"progressDeadlineSeconds ({own}s)"
    gap = training.longest_report_gap_seconds
    if gap is None:
        return None
    factor = names.LEARNED_DEADLINE_FACTOR
    learned = max(names.MIN_LEARNED_DEADLINE_SECONDS, math.ceil(factor * gap))
    return learned, (
        f"the learned progress deadline ({learned}s: {factor} x the longest gap between "
        f"rank 0's reports, {gap:.0f}s)"
    )


def progress_stalled(
    draft: Draft, job: DDPTrainingJob, workers: Mapping[int, PodView]
) -> Stall | None:
    """Why the running group must restart: rank 0's last progress report (status.training) is
    older than the progress deadline (`progress_deadline`); else None, and a requeue for when
    it would be. The rank the trainer found the group waiting on in this stall is named, for
    which the deadline waits a heartbeat longer when rank 0 has not said yet (its ledger
    thread finds it an interval after the stall: `culprit.Ledger.watch`). A learned deadline
    leaves alone a group whose ranks rank 0 found even and alive (a pause of the program's
    own, or a collective all of them wait in: its timeout is the bound).

    A report from before the newest worker was created belongs to an earlier attempt (or to
    before a suspension): the deadline waits for this attempt's first report, so startup, data
    download and compilation take what they take."""
    training = draft.status.training
    if training is None or training.updated_at is None:
        return None
    if training.attempt is not None and training.attempt != (draft.status.attempt or 0):
        return None  # an earlier attempt's rank 0, cut off but running: not this one's progress
    deadline = progress_deadline(job, training)
    if deadline is None:
        return None
    seconds, source = deadline
    created = [datetime.fromisoformat(p.created_at) for p in workers.values() if p.created_at]
    if not created or training.updated_at < max(created):
        return None
    left = seconds - (draft.now - training.updated_at).total_seconds()
    if left > 0:
        draft.requeue(left)
        return None
    found = training.stall
    if found is not None and (found.checked_at is None or found.checked_at < training.updated_at):
        found = None  # an earlier stall's
    if found is None and (wait := left + names.HEARTBEAT_SECONDS) > 0:
        draft.requeue(wait)  # rank 0's finding comes within an interval and a half of the stall
        return None
    learned = job.spec.run_policy.progress_deadline_seconds is None
    if learned and found is not None and found.rank is None:
        return None
    if training.step is not None and training.epoch is not None:
        where = f"epoch {training.epoch + 1}, step {training.step}"
        where += f" of {training.steps_per_epoch}" if training.steps_per_epoch else ""
    else:
        where = f"after epoch {training.epoch or 0}"
    last = training.updated_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    stalled = f"rank 0 last reported progress at {last} ({where}), more than {source} ago"
    if found is None or found.rank is None:
        return Stall(f"{stalled}: a rank or a collective hung")
    return Stall(f"{found.message} (found by rank 0); {stalled}", found)


def finish(
    draft: Draft,
    job: DDPTrainingJob,
    group: Group,
    phase: Literal["Succeeded", "Failed"],
    reason: str,
    message: str,
) -> None:
    draft.update(completion_time=draft.now)
    draft.condition(phase, "True", reason, message)
    if condition_status(draft.status, "Running") is not None:
        draft.condition("Running", "False", reason, message)
    if condition_status(draft.status, "Restarting") == "True":
        draft.condition("Restarting", "False", reason, message)
    draft.phase(phase, reason, message, warning=phase == "Failed")
    after_finish(draft, job, group)


def after_finish(draft: Draft, job: DDPTrainingJob, group: Group) -> None:
    """cleanPodPolicy, then ttlSecondsAfterFinished."""
    policy = job.spec.run_policy
    group.clean_up(draft, policy)
    ttl = policy.ttl_seconds_after_finished
    finished = draft.status.completion_time
    if ttl is not None and finished is not None:
        left = ttl - (draft.now - finished).total_seconds()
        if left <= 0:
            draft.actions.append(DeleteJob())
        else:
            draft.requeue(left)
