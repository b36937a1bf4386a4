"""The failure policy both launchers share: how a pod failed, which failure came first, and
whether the group restarts or the job fails (docs/design.md, "Failure rules")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from ddp_trainer import contract
from kube_ddp import names
from kube_ddp.api import MAX_AVOIDED_NODES, AvoidedNode, DDPTrainingJob, Failure
from kube_ddp.reasons import PodReason, Reason
from kube_ddp.status.draft import Draft
from kube_ddp.status.lifecycle import Group, finish, record_preemption
from kube_ddp.status.views import PodView


class TakenAway(StrEnum):
    """Reasons Kubernetes gives a pod it took away, as opposed to the program failing. Kueue's
    "Evicted" and "Preempted" (`Reason.EVICTED`, `Reason.PREEMPTED`) are another matter: a
    Workload's, which suspend the job."""

    EVICTED = "Evicted"  # the kubelet, under node pressure
    PREEMPTED = "Preempted"  # the kubelet, for a critical pod
    UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
    # the reasons of a pod's DisruptionTarget condition
    DELETION_BY_POD_GC = "DeletionByPodGC"
    EVICTION_BY_EVICTION_API = "EvictionByEvictionAPI"
    PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
    TERMINATION_BY_KUBELET = "TerminationByKubelet"
    # a NoExecute taint's eviction, such as the node controller's `unreachable` taint
    DELETION_BY_TAINT_MANAGER = "DeletionByTaintManager"


TAKEN_AWAY: frozenset[str] = frozenset(TakenAway)
# Pod reasons that mean the pod was taken away rather than the program failing.
LOST_REASONS: frozenset[str] = frozenset({*TakenAway, PodReason.DELETED, PodReason.NODE_LOST})
# The kubelet's reason for a container whose cgroup ran out of memory, whatever its exit code:
# under torchrun the OOM killer takes a rank, and torchrun itself then exits 1.
OOM_KILLED = "OOMKilled"
# How long past a pod's deletion deadline its kubelet has to confirm the pod is gone; after that
# its node is taken for lost and the pod is force-deleted.
NODE_SILENCE_SECONDS = 30


@dataclass(frozen=True, kw_only=True)
class WorkerFailure:
    pod: str
    reason: str
    message: str
    index: int = -1  # -1: not a worker (mpirun's launcher, the MPIJob)
    exit_code: int | None = None  # None: the pod was lost, not the program ended
    finished_at: str | None = None  # None: not known (vanished, still going away)
    launcher: bool = False  # launcher mpi: mpirun's pod, not a worker
    hung: bool = False  # runs, but made no progress for progressDeadlineSeconds
    vanished: bool = False  # gone before it was seen failing: nothing known but its absence
    # being deleted while it still runs, replaced before it ends (restarts in place), or
    # vanished there before any look saw it end: a preemption, however it ends
    taken_running: bool = False
    node: str | None = None  # where known: said in status.failure
    rank: int | None = None  # the global rank, where the trainer named it

    @property
    def lost_or_killed(self) -> bool:
        return (
            self.exit_code is None
            or self.exit_code >= contract.SIGNALLED
            or self.reason in LOST_REASONS
            or self.reason == OOM_KILLED
        )

    @property
    def peer_lost(self) -> bool:
        """The trainer's own exit when a collective timed out or a peer went away: what
        happened to another rank, not this one's program."""
        return self.exit_code == names.EXIT_PEER_LOST

    @property
    def preempted(self) -> bool:
        """The trainer saved a checkpoint on SIGTERM and stopped, or its pod is being taken
        away while it runs (and saves where its program can): resumed, never a failure."""
        return self.exit_code == names.EXIT_PREEMPTED or self.taken_running

    @property
    def cause_first(self) -> tuple[bool, str, bool, bool, bool, bool, int]:
        """The sort key that puts the failure that caused the others first: the earliest, one
        without a finish time after all timed ones, and a vanished pod after one seen failing
        (a peer evicted from a lost node names the node the vanished one was on too). Finish
        times have a resolution of one second; within the same second, a rank killed or lost
        comes first (its peers' errors, their collectives broken, follow from it), a rank that
        saw its peer go last, and a worker before mpirun, which only reports what happened to
        a rank."""
        timed = self.finished_at is not None
        return (
            not timed,
            self.finished_at or "",
            self.vanished,
            not self.lost_or_killed,
            self.peer_lost,
            self.launcher,
            self.index,
        )

    def describe(self) -> str:
        if self.hung:
            return f"{self.pod} made no progress ({self.message})"
        what = f"exited with code {self.exit_code}" if self.exit_code is not None else "was lost"
        if self.taken_running and self.vanished:
            what = "was deleted, its end unseen"
        elif self.taken_running:
            what = "is being deleted while it runs"
        elif self.preempted:
            what += " (it saved a checkpoint on SIGTERM and stopped)"
        if self.peer_lost:
            what += " (a collective timed out or a peer went away)"
        detail = f" ({self.reason}{': ' + self.message if self.message else ''})"
        return f"{self.pod} {what}{detail}"


def node_lost(pod: PodView) -> str | None:
    """Why `pod`'s node is taken for lost, if it is: the pod's phase is Unknown, or the taint
    manager evicted it after the node controller had marked it not ready (what it does to
    every pod of a node that stopped reporting)."""
    evicted_unready = (
        pod.reason == TakenAway.DELETION_BY_TAINT_MANAGER and pod.unready_since is not None
    )
    if pod.phase != "Unknown" and not evicted_unready:
        return None
    since = f" (not ready since {pod.unready_since})" if pod.unready_since else ""
    detail = f"; {pod.message}" if pod.message else ""
    return f"node {pod.node or '(unknown)'} stopped reporting{since}{detail}"


def force_delete_overdue(draft: Draft, pods: Iterable[PodView]) -> None:
    """Force-delete the pods being deleted that no kubelet will remove: at once where their
    node stopped reporting (`node_lost`), else NODE_SILENCE_SECONDS past their deletion
    deadline; requeue for the next one. The next attempt reuses their names."""
    overdue = []
    for pod in pods:
        if pod.deletion_deadline is None:
            continue
        deadline = datetime.fromisoformat(pod.deletion_deadline)
        left = NODE_SILENCE_SECONDS - (draft.now - deadline).total_seconds()
        if left <= 0 or node_lost(pod) is not None:
            overdue.append(pod)
        else:
            draft.requeue(left)
    draft.force_delete(overdue)


def pod_failure(pod: PodView) -> WorkerFailure | None:
    """How `pod` failed, if it did: it ended Failed, its node was lost, or it was deleted
    before it succeeded. A pod being deleted whose container still runs has not failed yet:
    its SIGTERM may be saving a checkpoint, and how it ends (the preempted code or another)
    decides."""
    lost = node_lost(pod)
    if pod.deleting and pod.phase in ("Pending", "Running") and lost is None:
        return None
    if not (pod.phase in ("Failed", "Unknown") or (pod.deleting and pod.phase != "Succeeded")):
        return None
    reason: str
    message = pod.message or ""
    if lost is not None:
        reason, message = PodReason.NODE_LOST, lost
    elif pod.phase == "Failed" and pod.exit_code == names.EXIT_PREEMPTED:
        reason = preempted_by(pod)
    else:
        reason = pod.reason or (PodReason.DELETED if pod.deleting else PodReason.ERROR)
    return WorkerFailure(
        pod=pod.name,
        index=pod.index,
        exit_code=pod.exit_code if pod.phase == "Failed" else None,
        reason=reason,
        message=message,
        finished_at=pod.finished_at or None,
        launcher=pod.role == names.MPI_LAUNCHER,
        node=pod.node,
    )


# A worker lost for these reasons was lost to its node: the next pods prefer other nodes.
NODE_FAULTS: frozenset[str] = frozenset({PodReason.NODE_LOST, TakenAway.EVICTED})


def avoid_lost_nodes(draft: Draft, job: DDPTrainingJob, failures: Iterable[WorkerFailure]) -> str:
    """Note in status.avoidedNodes the nodes `failures` were lost to, for
    `names.AVOID_NODE_SECONDS` (those past their time go); the words that say so, or "". The
    torchrun launcher's pods only: the MPI Operator makes its own."""
    if job.spec.launcher == "mpi":
        return ""
    until = draft.now + timedelta(seconds=names.AVOID_NODE_SECONDS)
    lost = {f.node: f.reason for f in failures if f.reason in NODE_FAULTS and f.node}
    if not lost and not draft.status.avoided_nodes:
        return ""
    kept = [
        a
        for a in draft.status.avoided_nodes
        if a.node not in lost and a.until is not None and a.until > draft.now
    ]
    added = [AvoidedNode(node=node, reason=reason, until=until) for node, reason in lost.items()]
    newest = sorted([*added, *kept], key=lambda a: a.until or draft.now, reverse=True)
    draft.update(avoided_nodes=sorted(newest[:MAX_AVOIDED_NODES], key=lambda a: a.node))
    if not added:
        return ""
    minutes = names.AVOID_NODE_SECONDS // 60
    return f"; the next pods prefer nodes other than {', '.join(sorted(lost))} for {minutes} min"


def avoided_nodes(draft: Draft) -> tuple[str, ...]:
    """The nodes the pods created now prefer not to run on."""
    return tuple(a.node for a in draft.status.avoided_nodes if a.until and a.until > draft.now)


def preempted_by(pod: PodView) -> str:
    """What stopped a pod that exited with the preempted code: Kubernetes' DisruptionTarget
    reason, else `Deleted` (a delete without one), else `Terminated` (a SIGTERM from elsewhere)."""
    if pod.reason in TAKEN_AWAY:
        return pod.reason
    return PodReason.DELETED if pod.deleting else PodReason.TERMINATED


def cause_first(failures: list[WorkerFailure]) -> list[WorkerFailure]:
    return sorted(failures, key=lambda f: f.cause_first)


# How long lost-peer exits wait for the failure that caused them: a rank's peers see it die at
# once (their connections close), the kubelet reports its container's end a second or more
# later.
CAUSE_GRACE_S: Final = 5.0


def awaiting_the_cause(
    failures: Sequence[WorkerFailure], pods: Iterable[PodView], now: datetime
) -> float | None:
    """Seconds to wait before deciding on `failures` when each is a lost-peer exit (88) and
    another worker still runs: the rank whose end they saw (killed, crashed) has likely not
    been reported yet, and an 88 taken for the cause would say the wrong pod and code. None:
    decide now (a cause is among them, no peer is left to be it, or the grace is over)."""
    if not failures or not all(f.peer_lost and f.finished_at for f in failures):
        return None
    failed = {f.index for f in failures}
    if not any(p.phase == "Running" and p.index not in failed for p in pods):
        return None
    first = min(datetime.fromisoformat(f.finished_at or "") for f in failures)
    left = CAUSE_GRACE_S - (now - first).total_seconds()
    return left if left > 0 else None


def is_retryable(job: DDPTrainingJob, failure: WorkerFailure) -> bool:
    """Which failures restart (docs/design.md, "Failure rules"): a lost pod or an OOM kill
    whatever the code, else the exit-code rule the pods' agents apply to their ranks too."""
    policy = job.spec.run_policy
    lost = failure.exit_code is None or failure.reason in LOST_REASONS
    if policy.restart_policy != "Never" and (lost or failure.reason == OOM_KILLED):
        return True  # evicted, deleted, node lost, out of memory: not the program's error
    code = failure.exit_code if failure.exit_code is not None else contract.SIGNALLED
    return contract.exit_restarts(code, policy.restart_policy, policy.retryable_exit_codes)


def failure_of(failure: WorkerFailure) -> Failure:
    """`status.failure` for `failure`."""
    return Failure(
        pod=failure.pod,
        node=failure.node,
        rank=failure.rank,
        exit_code=failure.exit_code,
        reason=failure.reason,
        message=failure.message,
    )


def fail_or_restart(
    draft: Draft, job: DDPTrainingJob, failures: list[WorkerFailure], group: Group
) -> None:
    """Restart the group if the first failure is retryable and restarts are left; else Failed.
    A first failure that is a preemption resumes the group, whatever the policy and the
    restarts left."""
    first = failures[0]
    if first.preempted:
        resume_preempted(draft, failures, group)
        return
    failed = Reason.LAUNCHER_FAILED if first.launcher else Reason.WORKER_FAILED
    if first.hung:
        failed = Reason.PROGRESS_DEADLINE_EXCEEDED
    draft.update(failure=failure_of(first))
    policy = job.spec.run_policy
    retryable = is_retryable(job, first)
    if retryable and draft.status.restarts < policy.backoff_limit:
        restarts = draft.status.restarts + 1
        message = (
            f"{first.describe()}; restarting the group "
            f"(restart {restarts} of at most {policy.backoff_limit})"
        ) + avoid_lost_nodes(draft, job, failures)
        attempt = draft.status.current_attempt + 1
        draft.update(restarts=restarts, attempt=attempt, in_place_restarts=0, replacing=[])
        draft.condition("Restarting", "True", failed, message)
        draft.condition("Running", "False", failed, message)
        draft.phase("Restarting", failed, message, warning=True)
        group.stop(draft)
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
            f"{names.EXIT_TEMPORARY}, {names.EXIT_PEER_LOST} and runPolicy.retryableExitCodes are)"
        )
    finish(draft, job, group, "Failed", reason, message)


def resume_preempted(draft: Draft, failures: list[WorkerFailure], group: Group) -> None:
    """Stop the group and start it again, `restarts` and `failure` unchanged: its workers
    saved a checkpoint and stopped because something outside took them away. An endless
    series of preemptions shows in `preemptions`, never as a failure."""
    preempted = [f for f in failures if f.preempted]
    # The pod Kubernetes said why it took, else the first: its peers stopped along with it.
    said = [f for f in preempted if f.reason in TAKEN_AWAY]
    cause = (said or preempted)[0]
    detail = f": {cause.message}" if cause.message else ""
    record_preemption(draft, cause.reason, f"{cause.pod}{detail}")
    message = (
        f"{cause.describe()}; preempted ({cause.reason}), resuming the group from its "
        f"checkpoint (preemption {draft.status.preemptions}, not counted as a restart)"
    )
    draft.condition("Restarting", "True", Reason.PREEMPTED, message)
    draft.condition("Running", "False", Reason.PREEMPTED, message)
    draft.phase("Restarting", Reason.PREEMPTED, message)
    draft.update(replacing=[])
    group.stop(draft)
