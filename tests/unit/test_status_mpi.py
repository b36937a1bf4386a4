"""The decision core for `launcher: mpi` as tables: job + observed MPIJob and its pods ->
status, actions, events. The MPIJob status shapes are the MPI Operator v0.8.2's, as measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kube_ddp import names
from kube_ddp.api import DDPTrainingJob
from kube_ddp.reasons import PodReason, Reason
from kube_ddp.status import (
    CreateWorkers,
    Decision,
    DeleteJob,
    DeleteMPIJob,
    MPIJobView,
    PodView,
    SuspendMPIJob,
    decide,
)
from tests.unit.test_status import NOW, UID, condition, job

T0 = "2026-11-22T11:55:00Z"  # the attempt's pods were created
T1 = "2026-11-22T11:56:00Z"  # the launcher started (once the workers were ready)
T2 = "2026-11-22T11:58:00Z"


def mpi_job(status: dict[str, Any] | None = None, **spec: Any) -> DDPTrainingJob:
    return job(status, launcher="mpi", **spec)


def started(phase: str = "Running", restarts: int = 0, **extra: Any) -> dict[str, Any]:
    return {"phase": phase, "restarts": restarts, "startTime": NOW - timedelta(minutes=5), **extra}


def mpijob(attempt: int = 0, *conditions: str, **fields: Any) -> MPIJobView:
    """An MPIJob whose conditions `conditions` are True ("Failed:MPIJobEvicted" gives a reason)."""
    table = {}
    for entry in conditions:
        type_, _, reason = entry.partition(":")
        table[type_] = ("True", reason, f"MPIJob {type_}")
    fields.setdefault("uid", MPIJOB_UID)
    fields.setdefault("owner_uid", UID)
    return MPIJobView(name="bar", attempt=attempt, conditions=table, **fields)


MPIJOB_UID = "mpijob-uid"


def launcher(phase: str = "Running", attempt: int = 0, **fields: Any) -> PodView:
    fields.setdefault("created_at", T1)
    fields.setdefault("owner_kind", "Job")
    fields.setdefault("owner_name", "bar-launcher")
    return PodView(
        name="bar-launcher-x7k2p",
        index=-1,
        attempt=attempt,
        phase=phase,
        scheduled=True,
        role=names.MPI_LAUNCHER,
        **fields,
    )


def worker(index: int, phase: str = "Running", attempt: int = 0, **fields: Any) -> PodView:
    fields.setdefault("created_at", T0)
    fields.setdefault("scheduled", phase != "Pending")
    fields.setdefault("owner_kind", "MPIJob")
    fields.setdefault("owner_uid", MPIJOB_UID)
    return PodView(
        name=f"bar-worker-{index}",
        index=index,
        attempt=attempt,
        phase=phase,
        role=names.MPI_WORKER,
        **fields,
    )


def failed(exit_code: int, **fields: Any) -> PodView:
    fields.setdefault("finished_at", T2)
    return launcher("Failed", exit_code=exit_code, reason="Error", **fields)


RUNNING_PODS = [launcher(), worker(0), worker(1)]


# --- creation and progress -------------------------------------------------------------------


def test_pods_only_labelled_as_the_jobs_are_neither_workers_nor_its_launcher() -> None:
    """A worker counts only where the MPIJob itself controls it, a launcher only where a batch
    Job does: an impostor labelled as the job's launcher, exiting 0, ends nothing, and one
    labelled as a worker is not counted."""
    impostors = [
        launcher("Succeeded", owner_kind=None),
        launcher("Failed", owner_name="another-launcher", exit_code=1, finished_at=T2),
        worker(2, "Failed", owner_uid="another-mpijob", exit_code=1),
    ]
    alone = decide(mpi_job(started()), RUNNING_PODS, NOW, mpijob=mpijob(0, "Running"))
    decision = decide(
        mpi_job(started()), [*RUNNING_PODS, *impostors], NOW, mpijob=mpijob(0, "Running")
    )
    assert decision.status.phase == alone.status.phase == "Running"
    assert decision.status.workers == alone.status.workers
    assert decision.status.failure is None and decision.actions == ()


def test_an_mpijob_of_the_jobs_name_that_it_does_not_own_is_never_its_own() -> None:
    """An MPIJob the job does not control (another owner's uid, or none) is neither deleted,
    suspended nor read: a new job creates its own, which the API server refuses as taken."""
    for owner in ("another-job-uid", None):
        foreign = mpijob(0, "Running", owner_uid=owner)
        earlier = mpijob(0, "Failed", completed=True, owner_uid=owner)
        decision = decide(mpi_job(), [], NOW, mpijob=foreign)
        assert decision.actions == (CreateWorkers(attempt=0, indices=()),)
        restarting = decide(mpi_job(started("Restarting", restarts=1)), [], NOW, mpijob=earlier)
        assert restarting.actions == (CreateWorkers(attempt=1, indices=()),)
        suspending = decide(
            mpi_job(started(), runPolicy={"suspend": True}), [], NOW, mpijob=foreign
        )
        assert not any(isinstance(a, SuspendMPIJob) for a in suspending.actions)


def test_new_job_creates_its_mpijob() -> None:
    decision = decide(mpi_job(), [], NOW)
    assert decision.actions == (CreateWorkers(attempt=0, indices=()),)
    assert decision.status.phase == "Pending"
    assert decision.status.start_time == NOW
    assert condition(decision, "Created") == ("True", Reason.MPIJOB_CREATED)


def test_a_created_mpijob_the_watch_has_not_shown_is_waited_for() -> None:
    decision = decide(mpi_job(started("Pending")), [], NOW, expected=["bar"])
    assert decision.actions == ()
    assert decision.status.phase == "Pending"


def test_created_suspended_creates_a_suspended_mpijob_and_no_start_time() -> None:
    decision = decide(mpi_job(runPolicy={"suspend": True}), [], NOW)
    assert decision.actions == (CreateWorkers(attempt=0, indices=()),)
    assert decision.status.phase == "Suspended"
    assert decision.status.start_time is None


@dataclass(frozen=True)
class ProgressCase:
    id: str
    mpijob: MPIJobView
    pods: list[PodView]
    phase: str
    reason: str
    schedulable: tuple[str, str] | None = None


PROGRESS = [
    ProgressCase("no-pods-yet", mpijob(0, "Created"), [], "Pending", Reason.WORKERS_PENDING, None),
    ProgressCase(
        "a-worker-cannot-be-placed",
        mpijob(0, "Created"),
        [worker(0), worker(1, "Pending", unschedulable="0/3 nodes are available")],
        "Pending",
        Reason.WORKERS_PENDING,
        ("False", Reason.UNSCHEDULABLE),
    ),
    ProgressCase(
        "workers-placed-launcher-waits",
        mpijob(0, "Created"),
        [worker(0), worker(1, "Pending", scheduled=True)],
        "Starting",
        Reason.WORKERS_STARTING,
        ("True", Reason.SCHEDULED),
    ),
    ProgressCase(
        "mpijob-running",
        mpijob(0, "Created", "Running"),
        RUNNING_PODS,
        "Running",
        Reason.LAUNCHER_RUNNING,
        ("True", Reason.SCHEDULED),
    ),
]


@pytest.mark.parametrize("case", PROGRESS, ids=[c.id for c in PROGRESS])
def test_phase_follows_the_mpijob_and_its_workers(case: ProgressCase) -> None:
    decision = decide(mpi_job(started("Pending")), case.pods, NOW, mpijob=case.mpijob)
    assert decision.actions == ()
    assert decision.status.phase == case.phase
    assert condition(decision, "Schedulable") == case.schedulable
    assert decision.status.workers is not None
    assert decision.status.workers.total == 2
    if case.phase == "Running":
        assert condition(decision, "Running") == ("True", Reason.LAUNCHER_RUNNING)
        assert decision.status.workers.running == 2


def test_an_mpijob_without_status_for_a_minute_says_the_mpi_operator_is_silent() -> None:
    """Installed CRD, no MPI Operator running: the MPIJob never gets a condition."""
    pending = mpi_job(started("Pending"))
    silent = mpijob(0, created_at=NOW - timedelta(seconds=61))
    soon = decide(pending, [], NOW - timedelta(seconds=31), mpijob=silent)
    assert soon.events == () and soon.requeue_after == 30
    decision = decide(pending, [], NOW, mpijob=silent)
    assert condition(decision, "Created") == ("True", Reason.MPI_OPERATOR_NOT_RESPONDING)
    assert [e.reason for e in decision.events] == [Reason.MPI_OPERATOR_NOT_RESPONDING]
    assert "is it installed and running" in decision.events[0].message
    again = decide(
        mpi_job(decision.status.model_dump(by_alias=True, mode="json")), [], NOW, mpijob=silent
    )
    assert again.events == ()  # said once
    # a restart's new MPIJob is measured from its own creation, not from the job's start
    fresh = mpijob(1, created_at=NOW)
    assert decide(mpi_job(started("Pending", restarts=1)), [], NOW, mpijob=fresh).events == ()


def test_the_launcher_is_not_counted_as_a_worker() -> None:
    decision = decide(mpi_job(started()), RUNNING_PODS, NOW, mpijob=mpijob(0, "Running"))
    assert decision.status.workers is not None
    assert decision.status.workers.running == 2


# --- the end ---------------------------------------------------------------------------------


def test_succeeded_mpijob_finishes_the_job() -> None:
    pods = [launcher("Succeeded", exit_code=0), worker(0), worker(1)]
    view = mpijob(0, "Created", "Succeeded", completed=True)
    decision = decide(mpi_job(started()), pods, NOW, mpijob=view)
    assert decision.status.phase == "Succeeded"
    assert decision.status.completion_time == NOW
    assert condition(decision, "Succeeded") == ("True", Reason.LAUNCHER_SUCCEEDED)
    assert "bar-launcher-x7k2p completed" in decision.events[0].message
    # cleanPodPolicy is the MPIJob's own: kube-ddp deletes nothing
    assert decision.actions == ()


@dataclass(frozen=True)
class MPIFailCase:
    """One failure of an attempt, and what kube-ddp makes of it."""

    id: str
    pods: list[PodView]
    mpijob: MPIJobView
    phase: str  # Restarting or Failed
    reason: str
    failed_pod: str
    exit_code: int | None
    policy: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    actions: tuple[Any, ...] = ()


FAILED_FOR_GOOD = mpijob(0, "Created", "Failed:BackoffLimitExceeded/Error", completed=True)
EVICTED = mpijob(0, "Created", "Failed:MPIJobEvicted")  # no completionTime: still running
RESTART = (DeleteMPIJob("bar"),)

MPI_FAILURES = [
    MPIFailCase(
        "rank-killed-restarts",
        [failed(137), worker(0), worker(1)],
        FAILED_FOR_GOOD,
        "Restarting",
        Reason.LAUNCHER_FAILED,
        "bar-launcher-x7k2p",
        137,
        actions=RESTART,
    ),
    MPIFailCase(
        "program-error-fails",
        [failed(1), worker(0), worker(1)],
        FAILED_FOR_GOOD,
        "Failed",
        Reason.NON_RETRYABLE_EXIT_CODE,
        "bar-launcher-x7k2p",
        1,
    ),
    MPIFailCase(
        "program-error-restarts-on-failure",
        [failed(1), worker(0), worker(1)],
        FAILED_FOR_GOOD,
        "Restarting",
        Reason.LAUNCHER_FAILED,
        "bar-launcher-x7k2p",
        1,
        policy={"restartPolicy": "OnFailure"},
        actions=RESTART,
    ),
    MPIFailCase(
        "listed-exit-code-restarts",
        [failed(3), worker(0), worker(1)],
        FAILED_FOR_GOOD,
        "Restarting",
        Reason.LAUNCHER_FAILED,
        "bar-launcher-x7k2p",
        3,
        policy={"retryableExitCodes": [3]},
        actions=RESTART,
    ),
    MPIFailCase(
        "never-fails-at-once",
        [failed(137), worker(0), worker(1)],
        FAILED_FOR_GOOD,
        "Failed",
        Reason.LAUNCHER_FAILED,
        "bar-launcher-x7k2p",
        137,
        policy={"restartPolicy": "Never"},
    ),
    MPIFailCase(
        "evicted-worker-restarts-the-group",
        [
            launcher(),
            worker(0),
            worker(1, "Failed", reason="Evicted", message="low on memory", finished_at=T2),
        ],
        EVICTED,
        "Restarting",
        Reason.WORKER_FAILED,
        "bar-worker-1",
        None,
        actions=RESTART,
    ),
    MPIFailCase(
        # The MPI Operator recreated a deleted worker at once (same name, created after the
        # launcher), and mpirun, which lost the rank's daemon, exited 205 in the same second.
        "replaced-worker-is-the-cause-not-mpiruns-205",
        [failed(205, finished_at=T2), worker(0), worker(1, created_at=T2)],
        FAILED_FOR_GOOD,
        "Restarting",
        Reason.WORKER_FAILED,
        "bar-worker-1",
        None,
        actions=RESTART,
    ),
    MPIFailCase(
        "no-restarts-left-stops-a-running-mpijob",
        [
            launcher(),
            worker(0),
            worker(1, "Failed", reason="Evicted", finished_at=T2),
        ],
        EVICTED,
        "Failed",
        Reason.BACKOFF_LIMIT_EXCEEDED,
        "bar-worker-1",
        None,
        policy={"backoffLimit": 1},
        restarts=1,
        actions=(SuspendMPIJob("bar", suspend=True),),
    ),
    MPIFailCase(
        "failed-mpijob-without-pods-says-the-mpi-operators-reason",
        [worker(0), worker(1)],
        FAILED_FOR_GOOD,
        "Restarting",
        Reason.LAUNCHER_FAILED,
        "bar",
        None,
        actions=RESTART,
    ),
]


@pytest.mark.parametrize("case", MPI_FAILURES, ids=[c.id for c in MPI_FAILURES])
def test_failures_restart_the_mpijob_or_fail_the_job(case: MPIFailCase) -> None:
    view = MPIJobView(
        name="bar",
        attempt=case.restarts,
        conditions=case.mpijob.conditions,
        completed=case.mpijob.completed,
        uid=MPIJOB_UID,
        owner_uid=UID,
    )
    pods = [PodView(**{**p.__dict__, "attempt": case.restarts}) for p in case.pods]
    job_ = mpi_job(started(restarts=case.restarts), runPolicy=case.policy)
    decision = decide(job_, pods, NOW, mpijob=view)
    assert decision.status.phase == case.phase
    assert decision.actions == case.actions
    failure = decision.status.failure
    assert failure is not None
    assert (failure.pod, failure.exit_code) == (case.failed_pod, case.exit_code)
    if case.phase == "Restarting":
        assert decision.status.restarts == case.restarts + 1
        assert condition(decision, "Restarting") == ("True", case.reason)
    else:
        assert decision.status.completion_time == NOW
        assert condition(decision, "Failed") == ("True", case.reason)


def test_the_failure_message_carries_mpiruns_last_words() -> None:
    last_words = "ORTE has lost communication with a remote daemon."
    pods = [failed(205, message=last_words), worker(0), worker(1)]
    decision = decide(
        mpi_job(started(), runPolicy={"restartPolicy": "Never"}),
        pods,
        NOW,
        mpijob=FAILED_FOR_GOOD,
    )
    assert decision.status.failure is not None
    assert decision.status.failure.message == last_words
    assert last_words in decision.events[0].message


# --- a new attempt ---------------------------------------------------------------------------


def test_a_restart_removes_the_old_mpijob_before_creating_the_next() -> None:
    restarting = mpi_job(started("Restarting", restarts=1))
    old = mpijob(0, "Created", "Failed", completed=True)
    assert decide(restarting, [], NOW, mpijob=old).actions == (DeleteMPIJob("bar"),)
    going = MPIJobView(name="bar", attempt=0, deleting=True, owner_uid=UID)
    assert decide(restarting, [], NOW, mpijob=going).actions == ()
    decision = decide(restarting, [], NOW)
    assert decision.actions == (CreateWorkers(attempt=1, indices=()),)
    assert decision.status.phase == "Pending"


def test_pods_of_the_last_attempt_do_not_count() -> None:
    pods = [failed(137, attempt=0), worker(0, attempt=1), worker(1, attempt=1)]
    decision = decide(
        mpi_job(started("Pending", restarts=1)), pods, NOW, mpijob=mpijob(1, "Created")
    )
    assert decision.actions == ()
    assert decision.status.failure is None


def test_a_vanished_mpijob_restarts_the_group() -> None:
    decision = decide(mpi_job(started()), [], NOW)
    assert decision.status.phase == "Restarting"
    assert decision.status.failure is not None
    assert (decision.status.failure.pod, decision.status.failure.reason) == (
        "bar",
        PodReason.DELETED,
    )
    assert decide(mpi_job(started("Restarting", restarts=1)), [], NOW).actions == (
        CreateWorkers(attempt=1, indices=()),
    )


# --- suspend, deadline, TTL --------------------------------------------------------------------


def test_suspend_and_resume_go_through_the_mpijob_and_count_no_restart() -> None:
    suspending = mpi_job(started(), runPolicy={"suspend": True})
    decision = decide(suspending, RUNNING_PODS, NOW, mpijob=mpijob(0, "Running"))
    assert decision.actions == (SuspendMPIJob("bar", suspend=True),)
    assert decision.status.phase == "Suspended"
    assert condition(decision, "Suspended") == ("True", Reason.SUSPENDED)

    resuming = mpi_job(decision.status.model_dump(by_alias=True, mode="json"))
    view = mpijob(0, "Suspended", suspended=True)
    decision = decide(resuming, [], NOW, mpijob=view)
    assert decision.actions == (SuspendMPIJob("bar", suspend=False),)
    assert decision.status.phase == "Pending"
    assert condition(decision, "Suspended") == ("False", Reason.RESUMED)
    assert decision.status.restarts == 0


def test_active_deadline_fails_the_job_and_stops_its_mpijob() -> None:
    over = mpi_job(started(), runPolicy={"activeDeadlineSeconds": 60})
    decision = decide(over, RUNNING_PODS, NOW, mpijob=mpijob(0, "Running"))
    assert decision.status.phase == "Failed"
    assert condition(decision, "Failed") == ("True", Reason.DEADLINE_EXCEEDED)
    assert decision.actions == (SuspendMPIJob("bar", suspend=True),)


def test_ttl_after_finish_deletes_the_job() -> None:
    done = started("Succeeded", completionTime=NOW - timedelta(seconds=61))
    view = mpijob(0, "Succeeded", completed=True)
    decision = decide(
        mpi_job(done, runPolicy={"ttlSecondsAfterFinished": 60}), [], NOW, mpijob=view
    )
    assert decision.actions == (DeleteJob(),)


def test_decisions_are_stable() -> None:
    """Called again with its own output, the core asks for nothing new."""
    cases: list[tuple[DDPTrainingJob, list[PodView], MPIJobView | None]] = [
        (mpi_job(started()), RUNNING_PODS, mpijob(0, "Running")),
        (mpi_job(started("Pending")), [worker(0)], mpijob(0, "Created")),
    ]
    for job_, pods, view in cases:
        first: Decision = decide(job_, pods, NOW, mpijob=view)
        again = decide(
            mpi_job(first.status.model_dump(by_alias=True, mode="json")), pods, NOW, mpijob=view
        )
        assert again.status == first.status
        assert again.actions == first.actions
        assert again.events == ()


# --- reading the MPI Operator's objects ----------------------------------------------------------


def test_mpijob_view_reads_the_mpi_operators_status() -> None:
    """Trimmed from a real v0.8.2 MPIJob that failed for good (a launcher exited 1)."""
    body = {
        "metadata": {
            "name": "bar",
            "labels": {names.LABEL_JOB_NAME: "bar", names.LABEL_ATTEMPT: "2"},
            "creationTimestamp": "2026-11-23T14:55:27Z",
        },
        "spec": {"runPolicy": {"suspend": False, "backoffLimit": 0}},
        "status": {
            "completionTime": "2026-11-23T14:55:59Z",
            "conditions": [
                {"type": "Created", "status": "True", "reason": "MPIJobCreated"},
                {"type": "Running", "status": "False", "reason": "MPIJobRunning"},
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded/",
                    "message": "Job has reached the specified backoff limit: ",
                },
            ],
            "replicaStatuses": {"Launcher": {"failed": 1}, "Worker": {}},
        },
    }
    view = MPIJobView.from_mpijob(body)
    assert (view.name, view.attempt, view.suspended, view.deleting) == ("bar", 2, False, False)
    assert view.failed and not view.succeeded and not view.true("Running")
    assert view.created_at == datetime(2026, 11, 23, 14, 55, 27, tzinfo=UTC)
    # Failed without completionTime (an evicted worker) is not the end
    del body["status"]["completionTime"]
    assert not MPIJobView.from_mpijob(body).failed


def test_mpi_pod_view_reads_a_launcher_and_a_worker() -> None:
    launcher_pod = {
        "metadata": {
            "name": "bar-launcher-x7k2p",
            "creationTimestamp": T1,
            "labels": {
                names.LABEL_JOB_NAME: "bar",
                names.LABEL_ATTEMPT: "1",
                names.MPI_LABEL_ROLE: "launcher",
                "training.kubeflow.org/job-name": "bar",
            },
            "ownerReferences": [{"kind": "Job", "uid": "job-uid", "controller": True}],
        },
        "spec": {"nodeName": "cpu-node-0"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "launcher",
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "Error",
                            "finishedAt": T2,
                            "message": "mpirun noticed that process rank 1 ... on signal 9",
                        }
                    },
                }
            ],
        },
    }
    view = PodView.from_mpi_pod(launcher_pod)
    assert (view.role, view.attempt, view.exit_code, view.created_at) == ("launcher", 1, 137, T1)
    assert view.index == -1
    worker_pod = {
        "metadata": {
            "name": "bar-worker-1",
            "labels": {
                names.LABEL_JOB_NAME: "bar",
                names.LABEL_ATTEMPT: "1",
                names.MPI_LABEL_ROLE: "worker",
                names.MPI_LABEL_REPLICA_INDEX: "1",
            },
        },
        "status": {"phase": "Running"},
    }
    assert (PodView.from_mpi_pod(worker_pod).role, PodView.from_mpi_pod(worker_pod).index) == (
        "worker",
        1,
    )
