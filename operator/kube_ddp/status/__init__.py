"""The pure decision core: a job and its observed pods in, the new status and next actions out.

Every failure rule of docs/design.md ("Status contract") lives in this package, so it can be
tested as a table without kopf or a cluster. `decide` is called on every change of a job or of
one of its pods; it must give the same answer when called again with the same inputs (the shell
may repeat it at any time). One module per policy: `views` (what is read of pods and MPIJobs),
`draft` (actions, Events, the decision being built), `lifecycle` (progress, suspend, deadline,
the end and its cleanup), `failures` (restart or fail), `torchrun` and `mpi` (the two
launchers' paths), `refusals` (what the API server's refusal of a child means for the job),
`history` (the run's curve by epoch, restarts and preemptions marked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Final

from kube_ddp.api import DDPTrainingJob, JobStatus
from kube_ddp.builders import termination_grace_seconds
from kube_ddp.reasons import Reason
from kube_ddp.status import history
from kube_ddp.status.draft import (
    Action,
    CreateWorkers,
    Decision,
    DeleteJob,
    DeleteMPIJob,
    DeletePods,
    Draft,
    Event,
    SuspendMPIJob,
)
from kube_ddp.status.failures import node_lost
from kube_ddp.status.lifecycle import FINISHED, UNDER_WAY, peers_grace_left
from kube_ddp.status.mpi import decide_mpi
from kube_ddp.status.refusals import Refusal, classify, most_decisive, refuse
from kube_ddp.status.torchrun import decide_torchrun
from kube_ddp.status.views import MPIJobView, PodView, mount_look_due

__all__ = [
    "FINISHED",
    "KIND_LOOK_SECONDS",
    "PATHS",
    "UNDER_WAY",
    "Action",
    "CreateWorkers",
    "Decision",
    "DeleteJob",
    "DeleteMPIJob",
    "DeletePods",
    "Event",
    "LauncherPath",
    "MPIJobView",
    "PodView",
    "Refusal",
    "SuspendMPIJob",
    "classify",
    "decide",
    "most_decisive",
    "mount_look_due",
    "node_lost",
    "peers_grace_left",
    "refuse",
    "reject",
    "wait_for_kind",
]

# One launcher's path of `decide`: the draft to fill, the job, its observed pods, the names
# of the ones created but not yet seen, its MPIJob (None where the launcher makes none) and
# who holds it suspended.
LauncherPath = Callable[
    [
        Draft,
        DDPTrainingJob,
        list[PodView],
        Sequence[str],
        MPIJobView | None,
        tuple[str, str] | None,
    ],
    None,
]
# Each launcher's path, by `spec.launcher`: the names of `kube_ddp.launchers.LAUNCHERS`, which
# builds what each path reads (that package sits above this one, so it is not asked here).
PATHS: Final[Mapping[str, LauncherPath]] = {"torchrun": decide_torchrun, "mpi": decide_mpi}
# How often a job waiting for a kind looks again: kopf starts the kind's watch when its CRD
# appears, and a gang's PodGroup is asked of discovery again.
KIND_LOOK_SECONDS: Final = 30.0


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
    draft = Draft(
        status=job.status or JobStatus(), now=now, grace_seconds=termination_grace_seconds(job)
    )
    # Pinned before a restart that keeps the attempt (in place, a replaced pod) moves restarts.
    draft.update(observed_generation=job.metadata.generation, attempt=draft.status.current_attempt)
    PATHS[job.spec.launcher](draft, job, list(pods), tuple(expected), mpijob, suspended_by)
    draft.update(training_history=history.follow(job.status or JobStatus(), draft.status))
    return draft.decision()


def reject(status: JobStatus, problems: list[str], now: datetime) -> Decision:
    """A job whose spec the models refuse (it slipped past the schema): Failed, with why."""
    draft = Draft(status=status, now=now)
    if status.phase != "Failed":
        message = "Invalid spec: " + "; ".join(problems)
        draft.update(completion_time=now)
        draft.condition("Failed", "True", Reason.INVALID_SPEC, message)
        draft.phase("Failed", Reason.INVALID_SPEC, message, warning=True)
    return draft.decision()


def wait_for_kind(status: JobStatus, problem: str, now: datetime) -> Decision:
    """A job that needs a kind this cluster does not serve yet (Kueue's Workload, the MPIJob,
    a gang's PodGroup): it waits, Pending with condition Created False naming what to
    install, said once, and goes on once the kind is served. A job under way keeps its phase
    (its children are there already); a finished one is left as it is."""
    draft = Draft(status=status, now=now)
    if status.phase in FINISHED:
        return draft.decision()
    said = next((c for c in status.conditions if c.type == "Created"), None)
    if said is None or (said.reason, said.message) != (Reason.KIND_NOT_SERVED, problem):
        draft.events.append(Event("Warning", Reason.KIND_NOT_SERVED, problem))
    draft.condition("Created", "False", Reason.KIND_NOT_SERVED, problem)
    if status.phase is None:
        draft.update(phase="Pending")
    draft.requeue(KIND_LOOK_SECONDS)
    return draft.decision()
