"""The pure decision core: a job and its observed pods in, the new status and next actions out.

Every failure rule of docs/design.md ("Status contract") lives here, so it can be tested as a
table without kopf or a cluster. `decide` is called on every change of a job or of one of its
pods; it must give the same answer when called again with the same inputs (the shell may
repeat it at any time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from kube_ddp import gang, names
from kube_ddp.api import (
    Condition,
    ConditionType,
    DDPTrainingJob,
    Failure,
    JobStatus,
    Phase,
    WorkerCounts,
)
from kube_ddp.reasons import PodReason, Reason

FINISHED: tuple[Phase, ...] = ("Succeeded", "Failed")
# Phases in which the pods of the current attempt have not all been created yet.
NOT_CREATED: tuple[Phase | None, ...] = (None, "Restarting", "Suspended")
# Pod reasons that mean the pod was taken away rather than the program failing.
LOST_REASONS = frozenset(
    {
        "Evicted",
        PodReason.DELETED,
        PodReason.NODE_LOST,
        "Preempted",
        "UnexpectedAdmissionError",
        # the reasons of a pod's DisruptionTarget condition
        "DeletionByPodGC",
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "TerminationByKubelet",
    }
)
# Seconds an MPIJob may go without any status before the job says the MPI Operator is silent.
MPI_OPERATOR_PATIENCE = 60.0
RETRYABLE_EXIT_CODE = 128  # >= 128: killed by a signal (OOM killer, SIGTERM, SIGKILL, abort)
# The kubelet's reason for a container whose cgroup ran out of memory, whatever its exit code:
# under torchrun the OOM killer takes a rank, and torchrun itself then exits 1.
OOM_KILLED = "OOMKilled"


# --- what we observe ------------------------------------------------------------------------


@dataclass(frozen=True)
class PodView:
    """What the core needs to know of one worker pod."""

    name: str
    index: int
    attempt: int
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    deleting: bool = False
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    finished_at: str | None = None
    scheduled: bool = False
    unschedulable: str | None = None  # the scheduler's message when it cannot place the pod
    owner_uid: str | None = None
    role: str | None = None  # launcher mpi: the MPI Operator's "launcher" or "worker"
    created_at: str | None = None

    @property
    def active(self) -> bool:
        return self.phase in ("Pending", "Running") and not self.deleting

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView:
        metadata = pod.get("metadata", {})
        labels = metadata.get("labels", {})
        status = pod.get("status", {})
        terminated = _terminated_state(status)
        conditions = {c.get("type"): c for c in status.get("conditions", [])}
        scheduled = conditions.get("PodScheduled", {})
        unschedulable = None
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            unschedulable = scheduled.get("message") or "the scheduler cannot place this pod"
        owners = [o for o in metadata.get("ownerReferences", []) if o.get("controller")]
        # Set when the pod is taken away (node gone, eviction, preemption) before it ends.
        disruption = conditions.get("DisruptionTarget", {})
        disrupted = disruption if disruption.get("status") == "True" else {}
        return cls(
            name=metadata.get("name", ""),
            index=_int(labels.get(names.LABEL_REPLICA_INDEX)),
            attempt=_int(labels.get(names.LABEL_ATTEMPT)),
            phase=status.get("phase") or "Pending",
            deleting=metadata.get("deletionTimestamp") is not None,
            exit_code=terminated.get("exitCode"),
            reason=disrupted.get("reason") or status.get("reason") or terminated.get("reason"),
            message=disrupted.get("message") or status.get("message") or terminated.get("message"),
            finished_at=terminated.get("finishedAt"),
            scheduled=bool(pod.get("spec", {}).get("nodeName"))
            or scheduled.get("status") == "True",
            unschedulable=unschedulable,
            owner_uid=owners[0].get("uid") if owners else None,
            created_at=metadata.get("creationTimestamp"),
        )

    @classmethod
    def from_mpi_pod(cls, pod: Mapping[str, Any]) -> PodView:
        """A launcher or worker pod the MPI Operator made for one of our MPIJobs."""
        labels = pod.get("metadata", {}).get("labels", {})
        return dataclasses.replace(
            cls.from_pod(pod),
            index=_int(labels.get(names.MPI_LABEL_REPLICA_INDEX)),
            role=labels.get(names.MPI_LABEL_ROLE),
        )


@dataclass(frozen=True)
class MPIJobView:
    """What the core needs to know of the MPIJob of a `launcher: mpi` job."""

    name: str
    attempt: int
    deleting: bool = False
    suspended: bool = False  # spec.runPolicy.suspend
    conditions: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    completed: bool = False  # completionTime is set: Succeeded or Failed for good
    created_at: datetime | None = None

    def true(self, type_: str) -> bool:
        return self.conditions.get(type_, ("False", "", ""))[0] == "True"

    @property
    def succeeded(self) -> bool:
        return self.true("Succeeded")

    @property
    def failed(self) -> bool:
        # Failed without completionTime (an evicted worker) can still end Succeeded.
        return self.true("Failed") and self.completed

    @classmethod
    def from_mpijob(cls, body: Mapping[str, Any]) -> MPIJobView:
        metadata = body.get("metadata", {})
        status = body.get("status") or {}
        return cls(
            name=metadata.get("name", ""),
            attempt=_int(metadata.get("labels", {}).get(names.LABEL_ATTEMPT)),
            deleting=metadata.get("deletionTimestamp") is not None,
            suspended=bool(body.get("spec", {}).get("runPolicy", {}).get("suspend")),
            conditions={
                c.get("type", ""): (c.get("status", ""), c.get("reason", ""), c.get("message", ""))
                for c in status.get("conditions") or []
            },
            completed=status.get("completionTime") is not None,
            created_at=_timestamp(metadata.get("creationTimestamp")),
        )


def _timestamp(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1


def _terminated_state(status: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer container's terminated state (the first container's if renamed)."""
    containers = status.get("containerStatuses") or []
    chosen = next((c for c in containers if c.get("name") == names.TRAINER_CONTAINER), None)
    chosen = chosen or (containers[0] if containers else {})
    return dict(chosen.get("state", {}).get("terminated") or {})


# --- what we decide -------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateWorkers:
    """Create the Service and the worker pods of `attempt` that do not exist yet."""

    attempt: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class DeletePods:
    names: tuple[str, ...]


@dataclass(frozen=True)
class DeleteJob:
    """ttlSecondsAfterFinished has passed."""


@dataclass(frozen=True)
class DeleteMPIJob:
    """launcher mpi: remove the attempt's MPIJob (and, through it, its pods) before a restart."""

    name: str


@dataclass(frozen=True)
class SuspendMPIJob:
    """launcher mpi: set the MPIJob's runPolicy.suspend; the MPI Operator stops or starts its
    pods."""

    name: str
    suspend: bool


Action = CreateWorkers | DeletePods | DeleteJob | DeleteMPIJob | SuspendMPIJob


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    status: JobStatus
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None  # seconds until a time-based rule fires


# --- helpers on status ----------------------------------------------------------------------


def set_condition(
    conditions: Iterable[Condition],
    type_: ConditionType,
    status: Literal["True", "False"],
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    """Conditions with `type_` set; its transition time moves only when its status changes."""
    result, found = [], False
    for condition in conditions:
        if condition.type != type_:
            result.append(condition)
            continue
        found = True
        moved = condition.status != status
        result.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=now if moved else condition.last_transition_time,
            )
        )
    if not found:
        result.append(
            Condition(
                type=type_, status=status, reason=reason, message=message, last_transition_time=now
            )
        )
    return result


def condition_status(status: JobStatus, type_: ConditionType) -> str | None:
    return next((c.status for c in status.conditions if c.type == type_), None)


@dataclass
class _Draft:
    """The status being built by one decision, with the actions and events it implies."""

    status: JobStatus
    now: datetime
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None

    def update(self, **changes: Any) -> None:
        self.status = self.status.model_copy(update=changes)

    def condition(
        self, type_: ConditionType, status: Literal["True", "False"], reason: str, message: str
    ) -> None:
        conditions = set_condition(self.status.conditions, type_, status, reason, message, self.now)
        self.update(conditions=conditions)

    def phase(self, phase: Phase, reason: str, message: str, warning: bool = False) -> None:
        """Move to `phase`; a change of phase is also a Kubernetes Event."""
        if self.status.phase != phase:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))
        self.update(phase=phase)

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def decision(self) -> Decision:
        return Decision(self.status, tuple(self.actions), tuple(self.events), self.requeue_after)


# --- the rules ------------------------------------------------------------------------------


def decide(
    job: DDPTrainingJob,
    pods: Iterable[PodView],
    now: datetime,
    expected: Iterable[str] = (),
    mpijob: MPIJobView | None = None,
    suspended_by: tuple[str, str] | None = None,
) -> Decision:
    """The next status and actions for `job`.

    `pods` are the job's pods as observed (for `launcher: mpi`, the MPI Operator's launcher
    and workers, and `mpijob` its MPIJob); `expected` names objects the operator created that
    the watch has not shown yet (they count as Pending, never as vanished); `suspended_by` is
    (reason, message) when a queue, not the user, holds the job suspended (`kueue.plan`).
    """
    status = job.status or JobStatus()
    draft = _Draft(status=status, now=now)
    if job.spec.launcher == "mpi":
        draft.update(observed_generation=job.metadata.generation)
        _decide_mpi(draft, job, mpijob, list(pods), set(expected))
        return draft.decision()
    attempt = status.restarts
    observed = list(pods)
    ours = [p for p in observed if p.owner_uid in (None, job.metadata.uid)]
    current = {p.index: p for p in ours if p.attempt == attempt}
    for name in expected:
        index = _index_of(job, name)
        if index is not None and index not in current:
            current[index] = PodView(name=name, index=index, attempt=attempt, phase="Pending")
    # Pods of another attempt, or of an earlier job of the same name: the next attempt
    # reuses their names, so they must be gone before it starts.
    stale = [p for p in observed if p.attempt != attempt or p not in ours]
    draft.update(observed_generation=job.metadata.generation)
    _count_workers(draft, job, current)

    if status.phase in FINISHED:
        _after_finish(draft, job, ours)
    elif job.spec.run_policy.suspend:
        _suspend(draft, observed, suspended_by)
    elif _deadline_passed(draft, job):
        deadline = job.spec.run_policy.active_deadline_seconds
        message = f"The job ran longer than activeDeadlineSeconds ({deadline}s)"
        _delete(draft, [p for p in observed if p.active])
        _finish(draft, job, ours, "Failed", Reason.DEADLINE_EXCEEDED, message)
    elif stale:
        _delete(draft, stale)
    elif status.phase in NOT_CREATED:
        if not any(p.deleting for p in current.values()):  # same names: let them go first
            missing = [i for i in range(job.spec.nodes) if i not in current]
            _create(draft, job, attempt, missing)
    elif (worker0 := current.get(0)) is not None and worker0.phase == "Succeeded":
        _finish(draft, job, ours, "Succeeded", Reason.WORKER_SUCCEEDED, f"{worker0.name} completed")
    elif failures := _failures(job, current):
        _fail_or_restart(draft, job, failures, observed)
    else:
        _progress(draft, job, current)
    return draft.decision()


def reject(status: JobStatus, problems: list[str], now: datetime) -> Decision:
    """A job whose spec the models refuse (it slipped past the schema): Failed, with why."""
    draft = _Draft(status=status, now=now)
    if status.phase != "Failed":
        message = "Invalid spec: " + "; ".join(problems)
        draft.update(completion_time=now)
        draft.condition("Failed", "True", Reason.INVALID_SPEC, message)
        draft.phase("Failed", Reason.INVALID_SPEC, message, warning=True)
    return draft.decision()


# --- launcher: mpi ---------------------------------------------------------------------------


def _decide_mpi(
    draft: _Draft,
    job: DDPTrainingJob,
    mpijob: MPIJobView | None,
    pods: list[PodView],
    expected: set[str],
) -> None:
    """`launcher: mpi`: one MPIJob per attempt, its state mirrored into the job's status.

    The MPI Operator runs the launcher and the workers; kube-ddp decides restarts (a new
    MPIJob, the whole group), the deadline and the TTL, with the torchrun rules (docs/mpi.md).
    """
    status = draft.status
    attempt = status.restarts
    policy = job.spec.run_policy
    current = [p for p in pods if p.attempt == attempt]
    workers = {p.index: p for p in current if p.role == names.MPI_WORKER}
    launchers = [p for p in current if p.role == names.MPI_LAUNCHER]
    _count_workers(draft, job, workers)

    if status.phase in FINISHED:
        _after_finish(draft, job, [], mpijob)
        return
    if mpijob is not None and (mpijob.attempt != attempt or mpijob.deleting):
        # An earlier attempt's MPIJob: the next one has the same name, so it must go first.
        if not mpijob.deleting:
            draft.actions.append(DeleteMPIJob(mpijob.name))
        return
    if _deadline_passed(draft, job):
        deadline = policy.active_deadline_seconds
        message = f"The job ran longer than activeDeadlineSeconds ({deadline}s)"
        _finish(draft, job, [], "Failed", Reason.DEADLINE_EXCEEDED, message, mpijob)
        return
    if mpijob is None:
        if job.name in expected:
            return  # created; the watch has not shown it yet
        if status.phase in NOT_CREATED:
            _create_mpijob(draft, job, attempt)
            return
        vanished = _WorkerFailure(
            job.name, -1, None, PodReason.DELETED, "the MPIJob was deleted", "~", launcher=True
        )
        _fail_or_restart(draft, job, [vanished], [], None)
        return

    if mpijob.suspended != policy.suspend:
        draft.actions.append(SuspendMPIJob(mpijob.name, suspend=policy.suspend))
    if policy.suspend:
        _suspend(draft, [])
        return
    if status.phase == "Suspended":
        _resume(draft, job)
    if not mpijob.conditions:
        _mpi_operator_silent(draft, job, mpijob)
    if mpijob.succeeded:
        launcher = next((p.name for p in launchers if p.phase == "Succeeded"), mpijob.name)
        message = f"{launcher} completed (mpirun exited 0)"
        _finish(draft, job, [], "Succeeded", Reason.LAUNCHER_SUCCEEDED, message, mpijob)
    elif failures := _mpi_failures(mpijob, launchers, workers):
        _fail_or_restart(draft, job, failures, [], mpijob)
    else:
        _mpi_progress(draft, job, mpijob, workers)


def _create_mpijob(draft: _Draft, job: DDPTrainingJob, attempt: int) -> None:
    """Create the attempt's MPIJob (suspended when the job is: its pods then wait)."""
    draft.actions.append(CreateWorkers(attempt=attempt, indices=()))
    message = f"Created the MPIJob (attempt {attempt}); the MPI Operator runs its pods"
    draft.condition("Created", "True", Reason.MPIJOB_CREATED, message)
    if job.spec.run_policy.suspend:
        _suspend(draft, [])
        return
    if draft.status.start_time is None:
        draft.update(start_time=draft.now)
    draft.phase("Pending", Reason.MPIJOB_CREATED, message)


def _mpi_operator_silent(draft: _Draft, job: DDPTrainingJob, mpijob: MPIJobView) -> None:
    """An MPIJob the MPI Operator has not acted on (no condition at all) for a while: say so
    once, rather than stay Pending without a word (is the MPI Operator running?)."""
    if mpijob.created_at is None:
        return
    waited = (draft.now - mpijob.created_at).total_seconds()
    if waited < MPI_OPERATOR_PATIENCE:
        draft.requeue(MPI_OPERATOR_PATIENCE - waited)
        return
    message = (
        f"The MPI Operator has not acted on the MPIJob {job.name} for "
        f"{MPI_OPERATOR_PATIENCE:.0f}s: is it installed and running?"
    )
    said = [c for c in draft.status.conditions if c.reason == Reason.MPI_OPERATOR_SILENT]
    if not said:
        draft.events.append(Event("Warning", Reason.MPI_OPERATOR_SILENT, message))
    draft.condition("Created", "True", Reason.MPI_OPERATOR_SILENT, message)


def _resume(draft: _Draft, job: DDPTrainingJob) -> None:
    draft.condition("Suspended", "False", Reason.RESUMED, "The job was resumed")
    if draft.status.start_time is None:
        draft.update(start_time=draft.now)
    draft.phase("Pending", Reason.RESUMED, f"Resumed the MPIJob {job.name}")


def _mpi_failures(
    mpijob: MPIJobView, launchers: list[PodView], workers: Mapping[int, PodView]
) -> list[_WorkerFailure]:
    """Failed launcher and worker pods of this attempt, the first one first.

    A worker the MPI Operator replaced while mpirun ran (created after the launcher) counts as
    lost: its rank died with the old pod, and mpirun cannot take a new one in.
    """
    failures = [f for p in [*launchers, *workers.values()] if (f := _pod_failure(p))]
    started = min((p.created_at for p in launchers if p.created_at), default=None)
    for pod in workers.values():
        if started and pod.created_at and pod.created_at > started and pod.phase != "Failed":
            message = "replaced while mpirun ran: its rank was lost with the pod before it"
            failures.append(
                _WorkerFailure(
                    pod.name, pod.index, None, PodReason.DELETED, message, pod.created_at
                )
            )
    if not failures and mpijob.failed:
        # Failed for good, with no pod left to say why (the MPI Operator's own reason).
        _, reason, message = mpijob.conditions["Failed"]
        failures.append(
            _WorkerFailure(
                mpijob.name, -1, None, reason or PodReason.ERROR, message, "~", launcher=True
            )
        )
    return _earliest_first(failures)


def _mpi_progress(
    draft: _Draft, job: DDPTrainingJob, mpijob: MPIJobView, workers: Mapping[int, PodView]
) -> None:
    """Pending until every worker is placed, Starting until mpirun and every worker run (the
    MPIJob's Running condition), then Running."""
    ordered = sorted(workers.values(), key=lambda p: p.index)
    _schedulable(draft, ordered, job.spec.nodes)
    nodes = job.spec.nodes
    if mpijob.true("Running"):
        message = f"mpirun and all {nodes} workers are running"
        draft.condition("Running", "True", Reason.LAUNCHER_RUNNING, message)
        if condition_status(draft.status, "Restarting") == "True":
            draft.condition("Restarting", "False", Reason.LAUNCHER_RUNNING, message)
        draft.phase("Running", Reason.LAUNCHER_RUNNING, message)
    elif len(ordered) == nodes and all(p.scheduled for p in ordered):
        running = sum(p.phase == "Running" for p in ordered)
        message = f"{running}/{nodes} workers running; mpirun starts once all are ready"
        draft.phase("Starting", Reason.WORKERS_STARTING, message)
    else:
        placed = sum(p.scheduled for p in ordered)
        draft.phase("Pending", Reason.WORKERS_PENDING, f"{placed}/{nodes} workers scheduled")


def _delete(draft: _Draft, pods: Iterable[PodView]) -> None:
    """Delete `pods`, skipping those already going; repeated deletes are harmless."""
    doomed = tuple(sorted({p.name for p in pods if not p.deleting}))
    if doomed:
        draft.actions.append(DeletePods(doomed))


def _index_of(job: DDPTrainingJob, pod_name: str) -> int | None:
    prefix = names.worker_name(job.name, 0)[:-1]
    suffix = pod_name.removeprefix(prefix)
    return int(suffix) if suffix != pod_name and suffix.isdigit() else None


def _count_workers(draft: _Draft, job: DDPTrainingJob, current: Mapping[int, PodView]) -> None:
    by_phase = [p.phase for p in current.values()]
    draft.update(
        workers=WorkerCounts(
            total=job.spec.nodes,
            pending=by_phase.count("Pending"),
            running=by_phase.count("Running"),
            succeeded=by_phase.count("Succeeded"),
            failed=by_phase.count("Failed") + by_phase.count("Unknown"),
        )
    )


def _create(draft: _Draft, job: DDPTrainingJob, attempt: int, indices: list[int]) -> None:
    """Create the group for this attempt (first start, after a restart, or on resume)."""
    draft.actions.append(CreateWorkers(attempt=attempt, indices=tuple(indices)))
    workers = draft.status.workers or WorkerCounts()
    draft.update(workers=workers.model_copy(update={"pending": workers.pending + len(indices)}))
    if draft.status.start_time is None:
        draft.update(start_time=draft.now)
    resumed = draft.status.phase == "Suspended"
    if resumed:
        draft.condition("Suspended", "False", Reason.RESUMED, "The job was resumed")
    message = f"Created {job.spec.nodes} worker pods (attempt {attempt})"
    draft.condition("Created", "True", Reason.WORKERS_CREATED, message)
    draft.phase("Pending", Reason.RESUMED if resumed else Reason.WORKERS_CREATED, message)


def _schedulable(
    draft: _Draft, workers: list[PodView], nodes: int, group: str | None = None
) -> None:
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


def _progress(draft: _Draft, job: DDPTrainingJob, current: Mapping[int, PodView]) -> None:
    """Pending until every worker is placed, Starting until every worker runs, then Running."""
    workers = sorted(current.values(), key=lambda p: p.index)
    _schedulable(draft, workers, job.spec.nodes, gang.describe(job))
    running = sum(p.phase in ("Running", "Succeeded") for p in workers)
    if running == job.spec.nodes:
        message = f"All {job.spec.nodes} workers are running"
        draft.condition("Running", "True", Reason.WORKERS_RUNNING, message)
        if condition_status(draft.status, "Restarting") == "True":
            draft.condition("Restarting", "False", Reason.WORKERS_RUNNING, message)
        draft.phase("Running", Reason.WORKERS_RUNNING, message)
    elif all(p.scheduled for p in workers):
        draft.phase(
            "Starting", Reason.WORKERS_STARTING, f"{running}/{job.spec.nodes} workers running"
        )
    else:
        placed = sum(p.scheduled for p in workers)
        draft.phase(
            "Pending", Reason.WORKERS_PENDING, f"{placed}/{job.spec.nodes} workers scheduled"
        )


@dataclass(frozen=True)
class _WorkerFailure:
    pod: str
    index: int
    exit_code: int | None
    reason: str
    message: str
    finished_at: str
    launcher: bool = False  # launcher mpi: mpirun's pod, not a worker

    @property
    def lost_or_killed(self) -> bool:
        return (
            self.exit_code is None
            or self.exit_code >= RETRYABLE_EXIT_CODE
            or self.reason in LOST_REASONS
            or self.reason == OOM_KILLED
        )

    def describe(self) -> str:
        what = f"exited with code {self.exit_code}" if self.exit_code is not None else "was lost"
        detail = f" ({self.reason}{': ' + self.message if self.message else ''})"
        return f"{self.pod} {what}{detail}"


def _failures(job: DDPTrainingJob, current: Mapping[int, PodView]) -> list[_WorkerFailure]:
    """Failed, lost or vanished workers of this attempt, the first one first."""
    failures = []
    for index in range(job.spec.nodes):
        pod = current.get(index)
        if pod is None:
            name = names.worker_name(job.name, index)
            failures.append(
                _WorkerFailure(name, index, None, PodReason.DELETED, "the pod was deleted", "~")
            )
        elif failure := _pod_failure(pod):
            failures.append(failure)
    return _earliest_first(failures)


def _pod_failure(pod: PodView) -> _WorkerFailure | None:
    """How `pod` failed, if it did: it ended Failed, its node was lost, or it is being
    deleted before it succeeded."""
    if not (pod.phase in ("Failed", "Unknown") or (pod.deleting and pod.phase != "Succeeded")):
        return None
    reason = pod.reason or (PodReason.NODE_LOST if pod.phase == "Unknown" else None)
    reason = reason or (PodReason.DELETED if pod.deleting else PodReason.ERROR)
    return _WorkerFailure(
        pod.name,
        pod.index,
        pod.exit_code if pod.phase == "Failed" else None,
        reason,
        pod.message or "",
        pod.finished_at or "~",  # "~" sorts after any timestamp
        launcher=pod.role == names.MPI_LAUNCHER,
    )


def _earliest_first(failures: list[_WorkerFailure]) -> list[_WorkerFailure]:
    # Finish times have a resolution of one second. Within the same second, a rank that was
    # killed or lost comes first: its peers' errors (their collectives broke) follow from it;
    # and a worker before mpirun, which only reports what happened to a rank.
    return sorted(
        failures, key=lambda f: (f.finished_at, not f.lost_or_killed, f.launcher, f.index)
    )


def is_retryable(job: DDPTrainingJob, failure: _WorkerFailure) -> bool:
    """Which failures restart the group (docs/design.md, "Failure rules")."""
    policy = job.spec.run_policy
    if policy.restart_policy == "Never":
        return False
    if policy.restart_policy == "OnFailure":
        return True
    if failure.exit_code is None:
        return True  # evicted, deleted, node lost: nothing wrong with the program
    if failure.reason in LOST_REASONS or failure.reason == OOM_KILLED:
        return True
    return (
        failure.exit_code >= RETRYABLE_EXIT_CODE
        or failure.exit_code == names.TEMPORARY_FAILURE_EXIT_CODE
        or failure.exit_code in policy.retryable_exit_codes
    )


def _fail_or_restart(
    draft: _Draft,
    job: DDPTrainingJob,
    failures: list[_WorkerFailure],
    pods: list[PodView],
    mpijob: MPIJobView | None = None,
) -> None:
    """Restart the group if the first failure is retryable and restarts are left; else Failed.
    For `launcher: mpi` the group is the attempt's MPIJob."""
    first = failures[0]
    failed = Reason.LAUNCHER_FAILED if first.launcher else Reason.WORKER_FAILED
    failure = Failure(
        pod=first.pod, exit_code=first.exit_code, reason=first.reason, message=first.message
    )
    draft.update(failure=failure)
    policy = job.spec.run_policy
    retryable = is_retryable(job, first)
    if retryable and draft.status.restarts < policy.backoff_limit:
        restarts = draft.status.restarts + 1
        message = (
            f"{first.describe()}; restarting the group "
            f"(restart {restarts} of at most {policy.backoff_limit})"
        )
        draft.update(restarts=restarts)
        draft.condition("Restarting", "True", failed, message)
        draft.condition("Running", "False", failed, message)
        draft.phase("Restarting", failed, message, warning=True)
        if job.spec.launcher != "mpi":
            _delete(draft, pods)
        elif mpijob is not None and not mpijob.deleting:
            draft.actions.append(DeleteMPIJob(mpijob.name))
        return
    if retryable:
        reason = Reason.BACKOFF_LIMIT_EXCEEDED
        message = f"{first.describe()}; backoffLimit {policy.backoff_limit} reached"
    elif policy.restart_policy == "Never":
        reason = failed
        message = f"{first.describe()}; restartPolicy is Never"
    else:
        reason = Reason.NON_RETRYABLE_EXIT_CODE
        message = (
            f"{first.describe()}; exit code {first.exit_code} is not retryable (codes >= 128, "
            f"{names.TEMPORARY_FAILURE_EXIT_CODE} and runPolicy.retryableExitCodes are)"
        )
    _finish(draft, job, pods, "Failed", reason, message, mpijob)


def _finish(
    draft: _Draft,
    job: DDPTrainingJob,
    pods: list[PodView],
    phase: Literal["Succeeded", "Failed"],
    reason: str,
    message: str,
    mpijob: MPIJobView | None = None,
) -> None:
    draft.update(completion_time=draft.now)
    draft.condition(phase, "True", reason, message)
    if condition_status(draft.status, "Running") is not None:
        draft.condition("Running", "False", reason, message)
    if condition_status(draft.status, "Restarting") == "True":
        draft.condition("Restarting", "False", reason, message)
    draft.phase(phase, reason, message, warning=phase == "Failed")
    _after_finish(draft, job, pods, mpijob)


def _after_finish(
    draft: _Draft, job: DDPTrainingJob, pods: list[PodView], mpijob: MPIJobView | None = None
) -> None:
    """cleanPodPolicy, then ttlSecondsAfterFinished."""
    policy = job.spec.run_policy
    if job.spec.launcher == "mpi":
        # The MPI Operator applies cleanPodPolicy when its MPIJob ends. One that kube-ddp
        # ends first (no restarts left for a lost worker, the deadline) is suspended: that
        # stops its pods and keeps the MPIJob to look at.
        if mpijob and not (mpijob.succeeded or mpijob.failed or mpijob.suspended):
            draft.actions.append(SuspendMPIJob(mpijob.name, suspend=True))
    elif policy.clean_pod_policy == "All":
        _delete(draft, pods)
    elif policy.clean_pod_policy == "Running":
        _delete(draft, [p for p in pods if p.active])
    ttl = policy.ttl_seconds_after_finished
    finished = draft.status.completion_time
    if ttl is not None and finished is not None:
        left = (finished + timedelta(seconds=ttl) - draft.now).total_seconds()
        if left <= 0:
            draft.actions.append(DeleteJob())
        else:
            draft.requeue(left)


def _suspend(draft: _Draft, pods: list[PodView], why: tuple[str, str] | None = None) -> None:
    """Suspended: no pods, the job kept; resuming recreates them without counting a restart."""
    _delete(draft, pods)
    reason, message = why or (
        Reason.SUSPENDED,
        "The job is suspended (runPolicy.suspend): its pods are removed",
    )
    draft.condition("Suspended", "True", reason, message)
    if condition_status(draft.status, "Running") == "True":
        draft.condition("Running", "False", reason, message)
    draft.phase("Suspended", reason, message)


def _deadline_passed(draft: _Draft, job: DDPTrainingJob) -> bool:
    deadline = job.spec.run_policy.active_deadline_seconds
    started = draft.status.start_time
    if deadline is None or started is None:
        return False
    left = (started + timedelta(seconds=deadline) - draft.now).total_seconds()
    if left > 0:
        draft.requeue(left)
        return False
    return True
