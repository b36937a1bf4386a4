"""Every reason kube-ddp writes into a condition, an Event or `status.failure`, in one place.

Users match on these words (alerts, `kubectl get events --field-selector reason=...`), so they
are a vocabulary, not strings scattered over the code; docs/design.md lists them, and a unit
test keeps that list and this one the same.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Reasons of the job's conditions and Events."""

    WORKERS_CREATED = "WorkersCreated"  # the pods of an attempt were created
    RESUMED = "Resumed"  # runPolicy.suspend went back to false
    WORKERS_PENDING = "WorkersPending"  # not every worker is scheduled yet
    WORKERS_STARTING = "WorkersStarting"  # all scheduled, not all running
    WORKERS_RUNNING = "WorkersRunning"  # every worker runs
    SCHEDULED = "Scheduled"  # Schedulable=True
    UNSCHEDULABLE = "Unschedulable"  # Schedulable=False: the scheduler cannot place a worker
    # ContainersStarted=False: the kubelet cannot start a worker's container (an image it
    # cannot pull, a root image under runAsNonRoot, a missing Secret)
    CONTAINER_CANNOT_START = "ContainerCannotStart"
    # ContainersStarted=False: the kubelet cannot mount a worker's volume (a ConfigMap, Secret
    # or claim that does not exist), in its FailedMount Event's words
    VOLUME_CANNOT_MOUNT = "VolumeCannotMount"
    CONTAINERS_STARTED = "ContainersStarted"  # ContainersStarted=True again
    WORKER_FAILED = "WorkerFailed"  # a group restart, or Failed under restartPolicy Never
    # Event, Restarting, failure.reason: a pod's agent restarted its ranks in place (the job
    # restarts in place), every pod kept
    RESTARTED_IN_PLACE = "RestartedInPlace"
    # Event, Restarting: a lost worker other than worker 0 is replaced alone, its peers wait
    WORKER_REPLACED = "WorkerReplaced"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"  # retryable, but no restarts left
    NON_RETRYABLE_EXIT_CODE = "NonRetryableExitCode"  # the program failed: restarting won't help
    DEADLINE_EXCEEDED = "DeadlineExceeded"  # activeDeadlineSeconds
    PROGRESS_DEADLINE_EXCEEDED = (
        "ProgressDeadlineExceeded"  # no progress for progressDeadlineSeconds: a group restart
    )
    WORKER_SUCCEEDED = "WorkerSucceeded"  # worker 0 exited 0
    # Straggler=True, Event: a rank's own part of each step is 1.5x the others' median or more
    STRAGGLER_DETECTED = "StragglerDetected"
    STRAGGLER_RECOVERED = "StragglerRecovered"  # Straggler=False, Event: it is one no more
    SUSPENDED = "Suspended"  # runPolicy.suspend
    QUEUED = "Queued"  # Suspended: waiting in a Kueue LocalQueue for its Workload's admission
    # Suspended: Kueue preempted its Workload for a higher priority one; Restarting, Event: the
    # workers saved a checkpoint on SIGTERM and stopped (EXIT_PREEMPTED), resumed uncounted
    PREEMPTED = "Preempted"
    EVICTED = "Evicted"  # Suspended: Kueue evicted its Workload (deactivated, stopped queue, ...)
    INVALID_SPEC = "InvalidSpec"  # the models or the API server refuse what the spec builds
    # Created False: the job needs a kind this cluster does not serve yet; it waits for it
    KIND_NOT_SERVED = "KindNotServed"
    # a child's name is held by an object this job does not control: waits where it goes by
    # itself (an earlier job's, being removed), else Failed
    NAME_TAKEN = "NameTaken"
    POD_SECURITY_VIOLATION = "PodSecurityViolation"  # Failed: the namespace's Pod Security level
    # Failed: the operator's own floor (operator_policy: an account, a NetworkPolicy widened)
    FORBIDDEN_BY_OPERATOR = "ForbiddenByOperator"
    ADMISSION_DENIED = "AdmissionDenied"  # Failed: a webhook or ValidatingAdmissionPolicy said no
    LIMIT_RANGE_VIOLATION = "LimitRangeViolation"  # Failed: outside the namespace's LimitRange
    ADMISSION_REFUSED = "AdmissionRefused"  # Failed: another admission plugin refused a child
    QUOTA_EXCEEDED = "QuotaExceeded"  # Created=False, Pending: waits for ResourceQuota room
    MPIJOB_CREATED = "MPIJobCreated"  # launcher mpi: the MPI Operator runs the pods
    MPI_OPERATOR_NOT_RESPONDING = (
        "MPIOperatorNotResponding"  # launcher mpi: its MPIJob has no status
    )
    LAUNCHER_RUNNING = "LauncherRunning"  # launcher mpi: mpirun and every worker run
    LAUNCHER_SUCCEEDED = "LauncherSucceeded"  # launcher mpi: mpirun exited 0
    LAUNCHER_FAILED = "LauncherFailed"  # launcher mpi: mpirun failed (a restart, or Failed)
    # Warning Event: someone other than the operator changed a status field the operator owns
    # (status/trust.py); the operator's own record of it is restored
    STATUS_OVERWRITTEN = "StatusOverwritten"
    # Warning Event: status fields that are not valid (a number out of range, a time without a
    # zone), ignored; the operator's own are written again
    STATUS_IGNORED = "StatusIgnored"
    # Warning Event and ReconcileFailing=True: the job's reconcile failed the same way several
    # times in a row (retried)
    RECONCILE_FAILING = "ReconcileFailing"
    RECONCILED = "Reconciled"  # ReconcileFailing=False: a reconcile succeeded again


class PodReason(StrEnum):
    """Reasons kube-ddp gives a worker failure in `status.failure` when the pod gives none."""

    DELETED = "Deleted"  # the pod was deleted, or vanished
    NODE_LOST = "NodeLost"  # phase Unknown: its node stopped reporting
    ERROR = "Error"  # it failed without saying why
    # it exited with the preempted code after a SIGTERM Kubernetes gave no reason for
    TERMINATED = "Terminated"
