"""`launcher: mpi`: one MPIJob per attempt, its state mirrored into the job's status.

The MPI Operator runs the launcher and the workers; kube-ddp decides restarts (a new MPIJob,
the whole group), the deadline and the TTL, with the torchrun rules (docs/mpi.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kube_ddp import names
from kube_ddp.api import DDPTrainingJob, RunPolicy
from kube_ddp.reasons import PodReason, Reason
from kube_ddp.status.draft import CreateWorkers, DeleteMPIJob, Draft, Event, SuspendMPIJob
from kube_ddp.status.failures import WorkerFailure, cause_first, fail_or_restart, pod_failure
from kube_ddp.status.lifecycle import (
    FINISHED,
    after_finish,
    count_workers,
    deadline_exceeded,
    finish,
    not_created,
    progress,
    suspend,
)
from kube_ddp.status.views import MPIJobView, PodView

# Seconds an MPIJob may go without any status before the job says the MPI Operator is silent.
MPI_OPERATOR_PATIENCE = 60.0


@dataclass(frozen=True)
class TheMPIJob:
    """The group as the MPI Operator has it: the attempt's MPIJob (None: not seen)."""

    mpijob: MPIJobView | None

    def stop(self, draft: Draft) -> None:
        if self.mpijob is not None and not self.mpijob.deleting:
            draft.actions.append(DeleteMPIJob(self.mpijob.name))

    def clean_up(self, draft: Draft, policy: RunPolicy) -> None:
        # The MPI Operator applies cleanPodPolicy when its MPIJob ends. One that kube-ddp
        # ends first (no restarts left for a lost worker, the deadline) is suspended: that
        # stops its pods and keeps the MPIJob to look at.
        mpijob = self.mpijob
        if mpijob and not (mpijob.succeeded or mpijob.failed or mpijob.suspended):
            draft.actions.append(SuspendMPIJob(mpijob.name, suspend=True))


def decide_mpi(
    draft: Draft,
    job: DDPTrainingJob,
    pods: list[PodView],
    expected: Sequence[str],
    mpijob: MPIJobView | None,
    suspended_by: tuple[str, str] | None,
) -> None:
    status = draft.status
    attempt = status.current_attempt
    policy = job.spec.run_policy
    if mpijob is not None and mpijob.owner_uid != job.metadata.uid:
        mpijob = None  # another object's of the same name: creating ours says it is taken
    current = [p for p in pods if p.attempt == attempt and made_for(p, mpijob)]
    workers = {p.index: p for p in current if p.role == names.MPI_WORKER}
    launchers = [p for p in current if p.role == names.MPI_LAUNCHER]
    count_workers(draft, job, workers)
    group = TheMPIJob(mpijob)

    if status.phase in FINISHED:
        after_finish(draft, job, group)
        return
    if mpijob is not None and (mpijob.attempt != attempt or mpijob.deleting):
        # An earlier attempt's MPIJob: the next one has the same name, so it must go first.
        if not mpijob.deleting:
            draft.actions.append(DeleteMPIJob(mpijob.name))
        return
    if (late := deadline_exceeded(draft, job)) is not None:
        finish(draft, job, group, "Failed", Reason.DEADLINE_EXCEEDED, late)
        return
    if mpijob is None:
        if job.name in expected:
            return  # created; the watch has not shown it yet
        if not_created(status):
            _create_mpijob(draft, job, attempt, suspended_by)
            return
        vanished = WorkerFailure(
            pod=job.name, reason=PodReason.DELETED, message="the MPIJob was deleted", launcher=True
        )
        fail_or_restart(draft, job, [vanished], group)
        return

    if mpijob.suspended != policy.suspend:
        draft.actions.append(SuspendMPIJob(mpijob.name, suspend=policy.suspend))
    if policy.suspend:
        suspend(draft, [], suspended_by)
        return
    if status.phase == "Suspended":
        _resume(draft, job)
    if not mpijob.conditions:
        _mpi_operator_not_responding(draft, job, mpijob)
    if mpijob.succeeded:
        launcher = next((p.name for p in launchers if p.phase == "Succeeded"), mpijob.name)
        message = f"{launcher} completed (mpirun exited 0)"
        finish(draft, job, group, "Succeeded", Reason.LAUNCHER_SUCCEEDED, message)
    elif failures := _failures(mpijob, launchers, workers):
        fail_or_restart(draft, job, failures, group)
    else:
        nodes = job.spec.nodes
        up = f"mpirun and all {nodes} workers are running" if mpijob.true("Running") else None
        progress(
            draft,
            job,
            workers,
            running=sum(p.phase == "Running" for p in workers.values()),
            up=up,
            reason=Reason.LAUNCHER_RUNNING,
            starting_note="; mpirun starts once all are ready",
        )


def made_for(pod: PodView, mpijob: MPIJobView | None) -> bool:
    """Whether the MPI Operator made `pod` for this job's MPIJob: a worker is controlled by
    the MPIJob itself (its uid), the launcher by the batch Job the MPI Operator made for it
    (the namespace's one Job of that name). Labels alone make nothing a worker or a launcher."""
    if mpijob is None:
        return False
    if pod.role == names.MPI_WORKER:
        return pod.owner_kind == names.MPIJOB_KIND and pod.owner_uid == mpijob.uid
    return (
        pod.role == names.MPI_LAUNCHER
        and pod.owner_kind == names.MPI_LAUNCHER_OWNER_KIND
        and pod.owner_name == names.mpi_launcher_job(mpijob.name)
    )


def _create_mpijob(
    draft: Draft, job: DDPTrainingJob, attempt: int, suspended_by: tuple[str, str] | None
) -> None:
    """Create the attempt's MPIJob (suspended when the job is: its pods then wait)."""
    draft.actions.append(CreateWorkers(attempt=attempt, indices=()))
    message = f"Created the MPIJob (attempt {attempt}); the MPI Operator runs its pods"
    draft.condition("Created", "True", Reason.MPIJOB_CREATED, message)
    if job.spec.run_policy.suspend:
        suspend(draft, [], suspended_by)
        return
    if draft.status.start_time is None:
        draft.update(start_time=draft.now)
    draft.phase("Pending", Reason.MPIJOB_CREATED, message)


def _mpi_operator_not_responding(draft: Draft, job: DDPTrainingJob, mpijob: MPIJobView) -> None:
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
    said = [c for c in draft.status.conditions if c.reason == Reason.MPI_OPERATOR_NOT_RESPONDING]
    if not said:
        draft.events.append(Event("Warning", Reason.MPI_OPERATOR_NOT_RESPONDING, message))
    draft.condition("Created", "True", Reason.MPI_OPERATOR_NOT_RESPONDING, message)


def _resume(draft: Draft, job: DDPTrainingJob) -> None:
    draft.condition("Suspended", "False", Reason.RESUMED, "The job was resumed")
    if draft.status.start_time is None:
        draft.update(start_time=draft.now)
    draft.phase("Pending", Reason.RESUMED, f"Resumed the MPIJob {job.name}")


def _failures(
    mpijob: MPIJobView, launchers: list[PodView], workers: Mapping[int, PodView]
) -> list[WorkerFailure]:
    """Failed launcher and worker pods of this attempt, the first one first.

    A worker the MPI Operator replaced while mpirun ran (created after the launcher) counts as
    lost: its rank died with the old pod, and mpirun cannot take a new one in.
    """
    failures = [f for p in [*launchers, *workers.values()] if (f := pod_failure(p))]
    started = min((p.created_at for p in launchers if p.created_at), default=None)
    for pod in workers.values():
        if started and pod.created_at and pod.created_at > started and pod.phase != "Failed":
            replaced = WorkerFailure(
                pod=pod.name,
                index=pod.index,
                reason=PodReason.DELETED,
                message="replaced while mpirun ran: its rank was lost with the pod before it",
                finished_at=pod.created_at,  # the old pod was gone by then
            )
            failures.append(replaced)
    if not failures and mpijob.failed:
        # Failed for good, with no pod left to say why (the MPI Operator's own reason).
        _, reason, message = mpijob.conditions["Failed"]
        ended = WorkerFailure(
            pod=mpijob.name, reason=reason or PodReason.ERROR, message=message, launcher=True
        )
        failures.append(ended)
    return cause_first(failures)
