"""The decision core as tables: job + observed pods -> status, actions, events."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from kube_ddp import names
from kube_ddp.api import MAX_SECONDS, DDPTrainingJob, JobStatus
from kube_ddp.reasons import Reason
from kube_ddp.status import (
    CreateWorkers,
    Decision,
    DeleteJob,
    DeletePods,
    PodView,
    decide,
    mount_look_due,
)
from kube_ddp.status.lifecycle import PEERS_END_GRACE
from tests.unit.support import job_document, make_job

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
UID = "uid-1"


# Where these tables restart the group: every pod recreated (test_status_inplace.py has the
# restarts in place that trainer jobs get by default)
RECREATE = {"restartStrategy": "Recreate"}


def job(status: dict[str, Any] | None = None, **spec: Any) -> DDPTrainingJob:
    spec = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}, **spec}
    spec["runPolicy"] = {**RECREATE, **spec.get("runPolicy", {})}
    document = job_document(spec)
    document["metadata"].update(uid=UID, generation=4)
    if status is not None:
        document["status"] = status
    base = make_job(**spec)
    return base.model_validate(document, by_alias=True)


def pod(index: int, phase: str = "Running", attempt: int = 0, **fields: Any) -> PodView:
    fields.setdefault("scheduled", phase != "Pending")
    fields.setdefault("owner_uid", UID)
    fields.setdefault("owner_kind", "DDPTrainingJob")
    return PodView(name=f"bar-worker-{index}", index=index, attempt=attempt, phase=phase, **fields)


def running(restarts: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Running",
        "restarts": restarts,
        "startTime": NOW - timedelta(minutes=5),
        **extra,
    }


def delete(*indices: int) -> DeletePods:
    return DeletePods(tuple(f"bar-worker-{i}" for i in indices))


def condition(decision: Decision, type_: str) -> tuple[str, str | None] | None:
    found = [c for c in decision.status.conditions if c.type == type_]
    return (found[0].status, found[0].reason) if found else None


def test_new_job_creates_its_workers() -> None:
    decision = decide(job(), [], NOW)
    assert decision.actions == (CreateWorkers(attempt=0, indices=(0, 1)),)
    assert decision.status.phase == "Pending"
    assert decision.status.start_time == NOW
    assert decision.status.observed_generation == 4
    assert decision.status.workers is not None and decision.status.workers.total == 2
    assert condition(decision, "Created") == ("True", "WorkersCreated")
    assert [e.reason for e in decision.events] == ["WorkersCreated"]


def test_partial_creation_creates_only_what_is_missing() -> None:
    decision = decide(job(), [pod(0, "Pending")], NOW)
    assert decision.actions == (CreateWorkers(attempt=0, indices=(1,)),)


def test_unschedulable_worker_is_reported_once() -> None:
    stuck = pod(
        1, "Pending", unschedulable="0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    )
    first = decide(job({"phase": "Pending"}), [pod(0, "Pending"), stuck], NOW)
    assert first.status.phase == "Pending"
    schedulable = next(c for c in first.status.conditions if c.type == "Schedulable")
    assert (schedulable.status, schedulable.reason) == ("False", "Unschedulable")
    assert schedulable.message == (
        "bar-worker-1: 0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    )
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "Unschedulable")]
    again = decide(job(first.status.model_dump(by_alias=True)), [pod(0, "Pending"), stuck], NOW)
    assert again.events == ()
    assert again.status == first.status


ROOT_IMAGE = "container has runAsNonRoot and image will run as root (pod: bar-worker-1)"


def test_a_container_the_kubelet_cannot_start_is_said_once_and_cleared() -> None:
    """A worker whose container waits in CreateContainerConfigError (a root image under
    runAsNonRoot): the pod stays Pending and only its container status says why."""
    stuck_pod = {
        "metadata": {"name": "bar-worker-1"},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {
                        "waiting": {"reason": "CreateContainerConfigError", "message": ROOT_IMAGE}
                    },
                }
            ],
        },
    }
    stuck = dataclasses.replace(
        PodView.from_pod(stuck_pod), index=1, attempt=0, owner_uid=UID, owner_kind="DDPTrainingJob"
    )
    said = f"container trainer: CreateContainerConfigError: {ROOT_IMAGE}: the image's user is root"
    assert stuck.cannot_start.startswith(said)
    assert "template.securityContext.runAsUser: 0" in stuck.cannot_start  # the field to set
    first = decide(job({"phase": "Pending"}), [pod(0), stuck], NOW)
    started = next(c for c in first.status.conditions if c.type == "ContainersStarted")
    assert (started.status, started.reason) == ("False", "ContainerCannotStart")
    assert started.message == f"bar-worker-1: {stuck.cannot_start}"
    assert ("Warning", "ContainerCannotStart") in [(e.type, e.reason) for e in first.events]
    again = decide(job(first.status.model_dump(by_alias=True)), [pod(0), stuck], NOW)
    assert again.events == ()
    cleared = decide(job(again.status.model_dump(by_alias=True)), [pod(0), pod(1)], NOW)
    assert condition(cleared, "ContainersStarted") == ("True", "ContainersStarted")


MISSING_CONFIGMAP = (
    'MountVolume.SetUp failed for volume "script" : configmap "train-script" not found'
)


def creating_pod(placed_seconds_ago: float) -> dict[str, Any]:
    placed = (NOW - timedelta(seconds=placed_seconds_ago)).isoformat()
    return {
        "metadata": {"name": "bar-worker-1", "uid": "pod-uid"},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": placed}
            ],
            "containerStatuses": [
                {"name": "trainer", "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
        },
    }


def test_a_worker_still_creating_its_containers_is_looked_at_for_mount_failures() -> None:
    """Placed 4 s ago, creating its containers: the job comes back when the kubelet's
    FailedMount Events are due a look, and every MOUNT_RELOOK_SECONDS after."""
    fresh = PodView.from_pod(creating_pod(4))
    assert fresh.creating_since == (NOW - timedelta(seconds=4)).isoformat()
    assert not mount_look_due(fresh, NOW)
    assert mount_look_due(PodView.from_pod(creating_pod(10)), NOW)
    fresh = dataclasses.replace(
        fresh, index=1, attempt=0, owner_uid=UID, owner_kind="DDPTrainingJob"
    )
    decision = decide(job({"phase": "Pending"}), [pod(0), fresh], NOW)
    assert decision.requeue_after == pytest.approx(names.MOUNT_LOOK_AFTER_SECONDS - 4)
    late = dataclasses.replace(
        PodView.from_pod(creating_pod(60)),
        index=1,
        attempt=0,
        owner_uid=UID,
        owner_kind="DDPTrainingJob",
    )
    decision = decide(job({"phase": "Pending"}), [pod(0), late], NOW)
    assert decision.requeue_after == names.MOUNT_RELOOK_SECONDS
    assert condition(decision, "ContainersStarted") is None  # nothing known against it yet


def test_a_pulling_or_started_pod_is_not_creating() -> None:
    pulling = creating_pod(60)
    pulling["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "ImagePullBackOff", "message": "back-off"}
    }
    assert PodView.from_pod(pulling).creating_since is None
    running = creating_pod(60)
    running["status"]["phase"] = "Running"
    assert PodView.from_pod(running).creating_since is None
    unplaced = creating_pod(60)
    unplaced["status"]["conditions"][0]["status"] = "False"
    assert PodView.from_pod(unplaced).creating_since is None


def test_a_volume_the_kubelet_cannot_mount_is_said_once_with_the_fix_and_cleared() -> None:
    stuck = dataclasses.replace(
        PodView.from_pod(creating_pod(30)),
        index=1,
        attempt=0,
        owner_uid=UID,
        owner_kind="DDPTrainingJob",
        cannot_mount=MISSING_CONFIGMAP,
    )
    first = decide(job({"phase": "Pending"}), [pod(0), stuck], NOW)
    started = next(c for c in first.status.conditions if c.type == "ContainersStarted")
    assert (started.status, started.reason) == ("False", "VolumeCannotMount")
    assert started.message.startswith(
        f"bar-worker-1: volume not mounted (kubelet, FailedMount): {MISSING_CONFIGMAP}: "
        "create that ConfigMap in the job's namespace"
    ), started.message
    assert "template.volumes" in started.message
    assert ("Warning", "VolumeCannotMount") in [(e.type, e.reason) for e in first.events]
    again = decide(job(first.status.model_dump(by_alias=True)), [pod(0), stuck], NOW)
    assert again.events == ()
    cleared = decide(job(again.status.model_dump(by_alias=True)), [pod(0), pod(1)], NOW)
    assert condition(cleared, "ContainersStarted") == ("True", "ContainersStarted")


@pytest.mark.parametrize(
    ("pods", "phase"),
    [
        ([pod(0, "Pending", scheduled=False), pod(1, "Pending", scheduled=False)], "Pending"),
        ([pod(0, "Pending", scheduled=True), pod(1, "Running")], "Starting"),
        ([pod(0), pod(1)], "Running"),
        ([pod(0), pod(1, "Succeeded")], "Running"),
    ],
    ids=["unscheduled", "scheduled", "running", "worker 1 done early"],
)
def test_phase_follows_the_workers(pods: list[PodView], phase: str) -> None:
    decision = decide(job({"phase": "Pending"}), pods, NOW)
    assert decision.status.phase == phase
    assert decision.actions == ()


def test_running_sets_the_condition_and_counts() -> None:
    decision = decide(job({"phase": "Starting"}), [pod(0), pod(1)], NOW)
    assert condition(decision, "Running") == ("True", "WorkersRunning")
    assert condition(decision, "Schedulable") == ("True", "Scheduled")
    workers = decision.status.workers
    assert workers is not None and (workers.running, workers.pending) == (2, 0)


def test_expected_pods_count_as_pending_not_vanished() -> None:
    decision = decide(job({"phase": "Pending"}), [pod(0)], NOW, expected=["bar-worker-1"])
    assert decision.actions == ()
    assert decision.status.phase == "Pending"
    assert decision.status.restarts == 0


@pytest.mark.parametrize(
    ("policy", "deleted_at_once", "deleted_after_grace"),
    [("Running", None, (1,)), ("All", (0,), (1,)), ("None", None, None)],
)
def test_worker0_success_finishes_the_job_its_peers_left_to_end_first(
    policy: str,
    deleted_at_once: tuple[int, ...] | None,
    deleted_after_grace: tuple[int, ...] | None,
) -> None:
    """Worker 1 still runs as worker 0 succeeds: it is past the same last step, so
    cleanPodPolicy removes it only if it still runs PEERS_END_GRACE later."""
    decision = decide(
        job(running(), runPolicy={"cleanPodPolicy": policy}),
        [pod(0, "Succeeded", exit_code=0), pod(1)],
        NOW,
    )
    assert decision.status.phase == "Succeeded"
    assert decision.status.completion_time == NOW
    assert condition(decision, "Succeeded") == ("True", "WorkerSucceeded")
    assert condition(decision, "Running") is None or condition(decision, "Running")[0] == "False"
    assert decision.actions == ((delete(*deleted_at_once),) if deleted_at_once else ())
    assert [e.reason for e in decision.events] == ["WorkerSucceeded"]
    grace = PEERS_END_GRACE.total_seconds()
    assert decision.requeue_after == (grace if deleted_after_grace else None)

    finished = job(decision.status.model_dump(by_alias=True), runPolicy={"cleanPodPolicy": policy})
    ended_in_time = decide(
        finished, [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)], NOW
    )
    assert ended_in_time.actions == ((delete(0, 1),) if policy == "All" else ())
    assert ended_in_time.requeue_after is None
    almost = decide(finished, [pod(0, "Succeeded", exit_code=0), pod(1)], NOW + PEERS_END_GRACE / 2)
    assert almost.requeue_after == (grace / 2 if deleted_after_grace else None)
    late = decide(finished, [pod(0, "Succeeded", exit_code=0), pod(1)], NOW + PEERS_END_GRACE)
    assert late.actions == {"Running": (delete(1),), "All": (delete(0, 1),), "None": ()}[policy]
    assert late.requeue_after is None


def test_the_live_peers_of_a_group_that_failed_go_at_once() -> None:
    decision = decide(
        job(running(), runPolicy={"backoffLimit": 0}), [pod(0, "Failed", exit_code=1), pod(1)], NOW
    )
    assert decision.status.phase == "Failed"
    assert decision.actions == (delete(1),)


@dataclass(frozen=True)
class RestartCase:
    """A worker failure that restarts the group (while restarts remain)."""

    id: str
    failed: PodView  # worker 1, as observed
    exit_code: int | None  # what status.failure reports
    reason: str  # likewise
    deleted: tuple[int, ...] = (0, 1)  # pods the restart deletes (not those already going)
    run_policy: dict[str, Any] = field(default_factory=dict)


RESTARTS = [
    RestartCase("exit 137", pod(1, "Failed", exit_code=137, reason="Error"), 137, "Error"),
    RestartCase(
        "exit 75: the trainer's failed download",
        pod(1, "Failed", exit_code=75, reason="Error"),
        75,
        "Error",
    ),
    RestartCase(
        "exit 1 listed as retryable",
        pod(1, "Failed", exit_code=1, reason="Error"),
        1,
        "Error",
        run_policy={"retryableExitCodes": [1]},
    ),
    RestartCase(
        "OnFailure retries exit 1",
        pod(1, "Failed", exit_code=1, reason="Error"),
        1,
        "Error",
        run_policy={"restartPolicy": "OnFailure"},
    ),
    RestartCase(
        "evicted", pod(1, "Failed", reason="Evicted", message="low memory"), None, "Evicted"
    ),
    RestartCase(
        "deleted, its program killed by the signal",
        pod(1, "Failed", exit_code=143, deleting=True),
        143,
        "Deleted",
        deleted=(0,),
    ),
    RestartCase("node lost", pod(1, "Unknown"), None, "NodeLost"),
    RestartCase(
        "a rank OOM-killed under torchrun (which exits 1)",
        pod(1, "Failed", exit_code=1, reason="OOMKilled"),
        1,
        "OOMKilled",
    ),
    RestartCase(
        "a collective timed out: the trainer's lost-peer exit",
        pod(1, "Failed", exit_code=88, reason="Error"),
        88,
        "Error",
    ),
    RestartCase(
        "pod GC after node loss",
        pod(1, "Failed", reason="DeletionByPodGC"),
        None,
        "DeletionByPodGC",
    ),
]


@pytest.mark.parametrize("case", RESTARTS, ids=[case.id for case in RESTARTS])
def test_retryable_failures_restart_the_group(case: RestartCase) -> None:
    decision = decide(job(running(), runPolicy=case.run_policy), [pod(0), case.failed], NOW)
    assert decision.status.phase == "Restarting"
    assert decision.status.restarts == 1
    failure = decision.status.failure
    assert failure is not None
    assert (failure.pod, failure.exit_code, failure.reason) == (
        "bar-worker-1",
        case.exit_code,
        case.reason,
    )
    assert condition(decision, "Restarting") == ("True", Reason.WORKER_FAILED)
    assert decision.actions == (delete(*case.deleted),)
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", Reason.WORKER_FAILED)]


@dataclass(frozen=True)
class FailCase:
    """A worker failure that fails the job."""

    id: str
    failed: PodView  # worker 1, as observed, in the attempt `restarts`
    reason: Reason  # of the Failed condition
    run_policy: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0  # group restarts before this failure


FAILURES = [
    FailCase(
        "exit 1 is the program's fault",
        pod(1, "Failed", exit_code=1, reason="Error"),
        Reason.NON_RETRYABLE_EXIT_CODE,
    ),
    FailCase(
        "restartPolicy Never, even on 137",
        pod(1, "Failed", exit_code=137),
        Reason.WORKER_FAILED,
        run_policy={"restartPolicy": "Never"},
    ),
    FailCase(
        "backoffLimit reached",
        pod(1, "Failed", exit_code=137, attempt=1),
        Reason.BACKOFF_LIMIT_EXCEEDED,
        run_policy={"backoffLimit": 1},
        restarts=1,
    ),
    FailCase(
        "backoffLimit 0",
        pod(1, "Failed", exit_code=143),
        Reason.BACKOFF_LIMIT_EXCEEDED,
        run_policy={"backoffLimit": 0},
    ),
]


@pytest.mark.parametrize("case", FAILURES, ids=[case.id for case in FAILURES])
def test_failures_that_fail_the_job(case: FailCase) -> None:
    worker0 = pod(0, attempt=case.restarts)
    status = running(case.restarts)
    decision = decide(job(status, runPolicy=case.run_policy), [worker0, case.failed], NOW)
    assert decision.status.phase == "Failed"
    assert decision.status.restarts == case.restarts
    failure = decision.status.failure
    assert failure is not None
    assert (failure.pod, failure.exit_code) == ("bar-worker-1", case.failed.exit_code)
    assert condition(decision, "Failed") == ("True", case.reason)
    assert decision.status.completion_time == NOW
    assert decision.actions == (delete(0),)  # cleanPodPolicy Running: the live worker goes
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", case.reason)]


def test_failure_message_names_the_pod_and_the_fix() -> None:
    decision = decide(job(running()), [pod(0), pod(1, "Failed", exit_code=1, reason="Error")], NOW)
    failed = next(c for c in decision.status.conditions if c.type == "Failed")
    assert failed.message == (
        "bar-worker-1 exited with code 1 (Error); exit code 1 is not retryable (codes >= 128, 75, "
        "88 and runPolicy.retryableExitCodes are)"
    )


def test_vanished_worker_restarts_the_group() -> None:
    decision = decide(job(running()), [pod(0)], NOW)
    assert decision.status.phase == "Restarting"
    assert decision.status.failure is not None
    assert (decision.status.failure.pod, decision.status.failure.reason) == (
        "bar-worker-1",
        "Deleted",
    )
    assert decision.actions == (delete(0),)


def test_first_failure_decides() -> None:
    root_cause = pod(1, "Failed", exit_code=1, finished_at="2026-11-22T11:59:00Z")
    aftermath = pod(0, "Failed", exit_code=134, finished_at="2026-11-22T11:59:30Z")
    decision = decide(job(running()), [aftermath, root_cause], NOW)
    assert decision.status.phase == "Failed"
    assert decision.status.failure is not None and decision.status.failure.exit_code == 1


def test_in_the_same_second_the_killed_rank_is_the_cause() -> None:
    """SIGKILL one rank and its peer's collective breaks (exit 1), often within the same
    second, the resolution of finish times: the kill, not the peer's error, decides."""
    same_second = "2026-11-22T11:59:00Z"
    peer = pod(0, "Failed", exit_code=1, finished_at=same_second)
    killed = pod(1, "Failed", exit_code=137, finished_at=same_second)
    decision = decide(job(running()), [peer, killed], NOW)
    assert decision.status.phase == "Restarting"
    assert decision.status.failure is not None
    assert (decision.status.failure.pod, decision.status.failure.exit_code) == ("bar-worker-1", 137)


def test_in_the_same_second_a_program_error_comes_before_a_lost_peer() -> None:
    """Rank 1's bug breaks rank 0's collective (its lost-peer exit, retryable): the bug
    decides, so the job fails fast instead of retrying it."""
    same_second = "2026-11-22T11:59:00Z"
    peer = pod(0, "Failed", exit_code=88, finished_at=same_second)
    bug = pod(1, "Failed", exit_code=1, finished_at=same_second)
    decision = decide(job(running()), [peer, bug], NOW)
    assert decision.status.phase == "Failed"
    assert decision.status.failure is not None
    assert (decision.status.failure.pod, decision.status.failure.exit_code) == ("bar-worker-1", 1)


@dataclass(frozen=True)
class CauseCase:
    """Lost-peer exits (88) seen before the failure that caused them."""

    id: str
    pods: tuple[PodView, ...]
    phase: str  # the job's phase after the decision
    requeue_after: float | None = None
    failed: tuple[str, int] | None = None  # status.failure's pod and exit code


def seconds_ago(seconds: int) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


CAUSES = [
    CauseCase(
        "an 88 while its peer still runs: the peer's end is awaited",
        (pod(0, "Failed", exit_code=88, finished_at=seconds_ago(1)), pod(1)),
        "Running",
        requeue_after=4.0,
    ),
    CauseCase(
        "the peer's kill, earlier, reported within the grace: it is the cause",
        (
            pod(0, "Failed", exit_code=88, finished_at=seconds_ago(3)),
            pod(1, "Failed", exit_code=137, finished_at=seconds_ago(4)),
        ),
        "Restarting",
        failed=("bar-worker-1", 137),
    ),
    CauseCase(
        "the grace over and the peer still running (hung): the 88 decides",
        (pod(0, "Failed", exit_code=88, finished_at=seconds_ago(5)), pod(1)),
        "Restarting",
        failed=("bar-worker-0", 88),
    ),
    CauseCase(
        "every worker ended 88: no peer is left to be the cause",
        (
            pod(0, "Failed", exit_code=88, finished_at=seconds_ago(1)),
            pod(1, "Failed", exit_code=88, finished_at=seconds_ago(1)),
        ),
        "Restarting",
        failed=("bar-worker-0", 88),
    ),
    CauseCase(
        "the peer is being deleted: its end (Deleted) is awaited too",
        (
            pod(0, "Failed", exit_code=88, finished_at=seconds_ago(1)),
            pod(1, deleting=True),
        ),
        "Running",
        requeue_after=4.0,
    ),
]


@pytest.mark.parametrize("case", CAUSES, ids=[case.id for case in CAUSES])
def test_lost_peer_exits_wait_a_moment_for_their_cause(case: CauseCase) -> None:
    """The CI's race: worker-0's 88 reached the operator before the kubelet reported worker-1's
    137, and the 88 was taken for the cause (the wrong pod and code in status.failure)."""
    decision = decide(job(running()), list(case.pods), NOW)
    assert decision.status.phase == case.phase
    assert decision.requeue_after == case.requeue_after
    failure = decision.status.failure
    assert (failure and (failure.pod, failure.exit_code)) == case.failed


CREATED = "2026-11-22T11:50:00Z"  # the attempt's pods


def report(seconds_ago: int, **fields: Any) -> dict[str, Any]:
    """status.training as rank 0 reported it `seconds_ago`: in epoch 3, at step 14 of 57."""
    at = NOW - timedelta(seconds=seconds_ago)
    return {"epoch": 2, "epochs": 6, "step": 14, "stepsPerEpoch": 57, "updatedAt": at, **fields}


@dataclass(frozen=True)
class StallCase:
    """runPolicy.progressDeadlineSeconds against rank 0's last report."""

    id: str
    training: dict[str, Any] | None
    phase: str  # the job's phase after the decision
    reason: str | None = None  # of the Restarting or Failed condition
    requeue_after: float | None = None
    run_policy: dict[str, Any] = field(default_factory=lambda: {"progressDeadlineSeconds": 60})
    pods: tuple[PodView, ...] = (pod(0, created_at=CREATED), pod(1, created_at=CREATED))
    restarts: int = 0


STALLS = [
    StallCase("no report yet: startup takes what it takes", None, "Running"),
    StallCase("a fresh report: checked again at the deadline", report(20), "Running", None, 40),
    StallCase(
        "past the deadline, no word from rank 0 on the stall: a heartbeat more for it",
        report(61),
        "Running",
        None,
        29,
    ),
    StallCase(
        "no progress past the deadline and a heartbeat",
        report(91),
        "Restarting",
        Reason.PROGRESS_DEADLINE_EXCEEDED,
    ),
    StallCase(
        "an old attempt's report does not count",
        report(600, updatedAt=datetime(2026, 11, 22, 11, 49, 59, tzinfo=UTC)),
        "Running",
    ),
    StallCase(
        "a report of another attempt is not this one's progress",
        report(91, attempt=3),
        "Running",
    ),
    StallCase(
        "a report of this attempt counts",
        report(91, attempt=0),
        "Restarting",
        Reason.PROGRESS_DEADLINE_EXCEEDED,
    ),
    StallCase(
        "only while every worker runs",
        report(600),
        "Pending",
        pods=(pod(0, created_at=CREATED), pod(1, "Pending", created_at=CREATED)),
    ),
    StallCase("no deadline, no rule", report(6000), "Running", run_policy={}),
    StallCase(
        "restartPolicy Never fails the job",
        report(91),
        "Failed",
        Reason.PROGRESS_DEADLINE_EXCEEDED,
        run_policy={"progressDeadlineSeconds": 60, "restartPolicy": "Never"},
    ),
    StallCase(
        "counted against backoffLimit",
        report(91),
        "Failed",
        Reason.BACKOFF_LIMIT_EXCEEDED,
        run_policy={"progressDeadlineSeconds": 60, "backoffLimit": 1},
        pods=(
            pod(0, attempt=1, created_at=CREATED),
            pod(1, attempt=1, created_at=CREATED),
        ),
        restarts=1,
    ),
]


@pytest.mark.parametrize("case", STALLS, ids=[case.id for case in STALLS])
def test_progress_deadline(case: StallCase) -> None:
    status = running(case.restarts, training=case.training)
    decision = decide(job(status, runPolicy=case.run_policy), list(case.pods), NOW)
    assert decision.status.phase == case.phase
    assert decision.requeue_after == case.requeue_after
    if case.reason is None:
        assert decision.actions == ()
        return
    type_ = "Restarting" if case.phase == "Restarting" else "Failed"
    assert condition(decision, type_) == ("True", case.reason)
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", case.reason)]
    failure = decision.status.failure
    assert failure is not None and failure.message is not None
    assert (failure.pod, failure.reason) == ("bar-worker-0", "ProgressDeadlineExceeded")
    assert failure.message == (
        "rank 0 last reported progress at 2026-11-22T11:58:29Z (epoch 3, step 14 of 57), "
        "more than progressDeadlineSeconds (60s) ago: a rank or a collective hung"
    )
    assert decision.actions == (delete(0, 1),)


def test_a_group_restarted_for_no_progress_says_so() -> None:
    status = running(training=report(91))
    pods = [pod(0, created_at=CREATED), pod(1, created_at=CREATED)]
    decision = decide(job(status, runPolicy={"progressDeadlineSeconds": 60}), pods, NOW)
    restarting = next(c for c in decision.status.conditions if c.type == "Restarting")
    assert restarting.message == (
        "bar-worker-0 made no progress (rank 0 last reported progress at 2026-11-22T11:58:29Z "
        "(epoch 3, step 14 of 57), more than progressDeadlineSeconds (60s) ago: a rank or a "
        "collective hung); restarting the group (restart 1 of at most 3)"
    )


STALL_PODS = [pod(0, created_at=CREATED), pod(1, created_at=CREATED)]


@pytest.mark.parametrize(
    ("gap", "seconds_ago", "phase"),
    [(30, 179, "Running"), (30, 181, "Restarting"), (5, 151, "Restarting"), (None, 500, "Running")],
    ids=[
        "within 5 x 30 s (+ 30)",
        "past it",
        "never under the minimum, 120 s",
        "no epoch ended yet",
    ],
)
def test_a_job_without_a_deadline_learns_one_from_its_reports(
    gap: float | None, seconds_ago: int, phase: str
) -> None:
    training = report(seconds_ago, longestReportGapSeconds=gap)
    decision = decide(job(running(training=training)), STALL_PODS, NOW)
    assert decision.status.phase == phase
    if phase == "Restarting":
        failure = decision.status.failure
        assert failure is not None and failure.message is not None
        learned = max(120, 5 * (gap or 0))
        assert f"more than the learned progress deadline ({learned}s: 5 x the longest gap " in (
            failure.message
        )


def test_ranks_restarted_in_place_get_the_time_a_new_attempt_gets() -> None:
    """Their agent restarted them (import, rendezvous, the checkpoint's load): the deadline
    waits for their first report, as for a new attempt's."""
    restarted = NOW - timedelta(seconds=200)
    rank_restart = {"attempt": 0, "count": 1, "time": restarted, "pod": "bar-worker-1"}
    status = running(training=report(300), rankRestart=rank_restart, inPlaceRestarts=1)
    decision = decide(job(status, runPolicy={"progressDeadlineSeconds": 60}), STALL_PODS, NOW)
    assert decision.status.phase == "Running"
    status["training"] = report(100)  # they reported: the deadline counts again
    decision = decide(job(status, runPolicy={"progressDeadlineSeconds": 60}), STALL_PODS, NOW)
    assert decision.status.phase == "Restarting"


SLOW = {
    "rank": 1,
    "pod": "bar-worker-1",
    "node": "cpu-3",
    "slowerBy": 3.7,
    "message": "rank 1 (pod bar-worker-1, node cpu-3) takes 3.7x the median time ...",
}


def test_a_straggler_is_said_on_the_job_once_and_cleared_when_it_recovers() -> None:
    """Straggler=True with a Warning Event naming the rank, once; an earlier group's finding
    counts for nothing; False with an Event when rank 0 cleared it."""
    training = report(10, straggler={**SLOW, "checkedAt": NOW - timedelta(seconds=5)})
    decision = decide(job(running(training=training)), STALL_PODS, NOW)
    assert condition(decision, "Straggler") == ("True", "StragglerDetected")
    assert [(e.type, e.reason, e.message) for e in decision.events] == [
        ("Warning", "StragglerDetected", SLOW["message"])
    ]
    said = decision.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    again = decide(job(said), STALL_PODS, NOW)
    assert (condition(again, "Straggler"), again.events) == (("True", "StragglerDetected"), ())
    said["training"]["straggler"] = None
    cleared = decide(job(said), STALL_PODS, NOW)
    assert condition(cleared, "Straggler") == ("False", "StragglerRecovered")
    assert [e.reason for e in cleared.events] == ["StragglerRecovered"]
    earlier = report(10, straggler={**SLOW, "checkedAt": "2026-11-22T11:49:00Z"})
    decision = decide(job(running(training=earlier)), STALL_PODS, NOW)
    assert condition(decision, "Straggler") is None and decision.events == ()


def stall(seconds_ago: int, rank: int | None = 1) -> dict[str, Any]:
    """status.training.stall as rank 0 found it `seconds_ago`: rank 1 of node cpu-3 behind,
    or (rank None) every rank even."""
    if rank is None:
        found = {"message": "no rank fell behind: all 2 were at 80 collective(s) and were ..."}
    else:
        found = {
            "rank": rank,
            "pod": f"bar-worker-{rank}",
            "node": "cpu-3",
            "step": 13,
            "message": f"rank {rank} (pod bar-worker-{rank}, node cpu-3) stopped first, at "
            "step 13: 1 collective(s) behind the others",
        }
    return {**found, "checkedAt": NOW - timedelta(seconds=seconds_ago)}


def test_the_rank_the_group_waited_on_is_named_not_rank_0() -> None:
    """Rank 0 reports; the rank that hung is another, found by rank 0's ledger thread in this
    stall: status.failure, the condition and the Event name its pod, node and rank."""
    training = report(61, stall=stall(30))
    decision = decide(
        job(running(training=training), runPolicy={"progressDeadlineSeconds": 60}), STALL_PODS, NOW
    )
    failure = decision.status.failure
    assert failure is not None and failure.message is not None
    assert (failure.pod, failure.node, failure.rank) == ("bar-worker-1", "cpu-3", 1)
    assert failure.message.startswith(
        "rank 1 (pod bar-worker-1, node cpu-3) stopped first, at step 13: 1 collective(s) "
        "behind the others (found by rank 0); rank 0 last reported progress at "
    )
    restarting = next(c for c in decision.status.conditions if c.type == "Restarting")
    assert restarting.message is not None
    assert restarting.message.startswith("bar-worker-1 made no progress (rank 1 (pod bar-worker-1")
    assert [e.message for e in decision.events] == [restarting.message]
    older = report(91, stall=stall(120))  # found in an earlier stall, before the last report
    decision = decide(
        job(running(training=older), runPolicy={"progressDeadlineSeconds": 60}), STALL_PODS, NOW
    )
    assert decision.status.failure is not None
    assert (decision.status.failure.pod, decision.status.failure.rank) == ("bar-worker-0", None)


def test_a_group_found_even_is_left_to_its_collective_timeout_unless_the_user_set_one() -> None:
    """Every rank even and heard from: a pause of the program's own (a long validation) or a
    collective all wait in; the learned deadline does not fire, the user's does."""
    training = report(300, longestReportGapSeconds=30, stall=stall(30, rank=None))
    assert decide(job(running(training=training)), STALL_PODS, NOW).status.phase == "Running"
    own = job(running(training=training), runPolicy={"progressDeadlineSeconds": 60})
    decision = decide(own, STALL_PODS, NOW)
    assert decision.status.phase == "Restarting"
    assert decision.status.failure is not None
    assert decision.status.failure.pod == "bar-worker-0"


UNREADY = "2026-11-22T11:58:40Z"  # the node controller marked the node's pods not ready
TAINT_EVICTION = {"reason": "DeletionByTaintManager", "message": "Taint manager: deleting"}


def on_lost_node(index: int, gone_by: str, attempt: int = 0, **fields: Any) -> PodView:
    """A pod of node cpu-3, which stopped reporting: deleted, to be gone by `gone_by`."""
    fields.setdefault("unready_since", UNREADY)
    return pod(
        index, attempt=attempt, node="cpu-3", deleting=True, deletion_deadline=gone_by, **fields
    )


@dataclass(frozen=True)
class NodeLossCase:
    """Pods on a node that stopped reporting: the group restarts naming the node; pods the
    taint manager evicted from it are force-deleted at once (no kubelet will confirm them
    gone), others 30 s past their deadline."""

    id: str
    status: dict[str, Any]
    pods: tuple[PodView, ...]
    phase: str
    actions: tuple[Any, ...]
    requeue_after: float | None = None
    failure: tuple[str, str] | None = None  # (reason, message) of status.failure


LOST_MESSAGE = (
    "node cpu-3 stopped reporting (not ready since 2026-11-22T11:58:40Z); Taint manager: deleting"
)
NODE_LOSSES = [
    NodeLossCase(
        "evicted for the unreachable taint: a restart naming the node, the pod force-deleted",
        running(),
        (pod(0), on_lost_node(1, "2026-11-22T12:00:20Z", **TAINT_EVICTION)),
        "Restarting",
        (DeletePods(("bar-worker-1",), force=True), delete(0)),
        failure=("NodeLost", LOST_MESSAGE),
    ),
    NodeLossCase(
        "worker 0 gone unseen, worker 1 evicted from the lost node: the node is named",
        running(),
        (on_lost_node(1, "2026-11-22T12:00:20Z", **TAINT_EVICTION),),
        "Restarting",
        (DeletePods(("bar-worker-1",), force=True),),
        failure=("NodeLost", LOST_MESSAGE),
    ),
    NodeLossCase(
        "phase Unknown: a restart naming the node",
        running(),
        (pod(0), pod(1, "Unknown", node="cpu-3", unready_since=UNREADY)),
        "Restarting",
        (delete(0, 1),),
        failure=("NodeLost", "node cpu-3 stopped reporting (not ready since 2026-11-22T11:58:40Z)"),
    ),
    NodeLossCase(
        "a taint eviction of a ready pod is not a lost node: its end is waited for",
        running(),
        (
            pod(0),
            pod(
                1,
                deleting=True,
                node="cpu-3",
                deletion_deadline="2026-11-22T12:00:20Z",
                **TAINT_EVICTION,
            ),
        ),
        "Running",
        (),
        requeue_after=50,
    ),
    NodeLossCase(
        "the old attempt's pod within its deadline and 30 s: waited for",
        running(1, phase="Restarting"),
        (on_lost_node(1, "2026-11-22T11:59:40Z"),),
        "Restarting",
        (),
        requeue_after=10,
    ),
    NodeLossCase(
        "the old attempt's pod 30 s past its deadline: force-deleted",
        running(1, phase="Restarting"),
        (on_lost_node(1, "2026-11-22T11:59:30Z"),),
        "Restarting",
        (DeletePods(("bar-worker-1",), force=True),),
    ),
    NodeLossCase(
        "a finished job's pods too",
        running(phase="Succeeded"),
        (on_lost_node(1, "2026-11-22T11:50:00Z"),),
        "Succeeded",
        (DeletePods(("bar-worker-1",), force=True),),
    ),
]


@pytest.mark.parametrize("case", NODE_LOSSES, ids=[case.id for case in NODE_LOSSES])
def test_a_node_that_stopped_reporting(case: NodeLossCase) -> None:
    decision = decide(job(case.status), list(case.pods), NOW)
    assert decision.status.phase == case.phase
    assert decision.actions == case.actions
    assert decision.requeue_after == case.requeue_after
    if case.failure is not None:
        failure = decision.status.failure
        assert failure is not None
        assert (failure.reason, failure.message) == case.failure
        assert condition(decision, "Restarting") == ("True", Reason.WORKER_FAILED)


def test_the_next_attempt_starts_once_the_lost_pods_are_gone() -> None:
    decision = decide(job(running(1, phase="Restarting")), [], NOW)
    assert decision.actions == (CreateWorkers(attempt=1, indices=(0, 1)),)


def test_restart_clears_the_old_attempt_before_creating_the_next() -> None:
    restarting = {"phase": "Restarting", "restarts": 1, "startTime": NOW}
    old = [pod(0, attempt=0), pod(1, "Failed", attempt=0, exit_code=137)]
    assert decide(job(restarting), old, NOW).actions == (delete(0, 1),)
    going = [pod(0, attempt=0, deleting=True)]
    waiting = decide(job(restarting), going, NOW)
    assert (waiting.actions, waiting.status.phase) == ((), "Restarting")
    fresh = decide(job(restarting), [], NOW)
    assert fresh.actions == (CreateWorkers(attempt=1, indices=(0, 1)),)
    assert fresh.status.phase == "Pending"
    assert fresh.status.restarts == 1
    assert fresh.status.start_time == NOW


def test_restarting_condition_clears_when_the_group_runs_again() -> None:
    status = running(1, phase="Starting")
    status["conditions"] = [
        {"type": "Restarting", "status": "True", "reason": "WorkerFailed", "message": "x"}
    ]
    decision = decide(job(status), [pod(0, attempt=1), pod(1, attempt=1)], NOW)
    assert decision.status.phase == "Running"
    assert condition(decision, "Restarting") == ("False", "WorkersRunning")


def test_pods_of_an_earlier_job_with_the_same_name_go_first() -> None:
    foreign = pod(0, owner_uid="old-uid")
    decision = decide(job(), [foreign], NOW)
    assert decision.actions == (delete(0),)
    assert decision.status.phase is None


def test_ttl_after_finish() -> None:
    finished = {"phase": "Succeeded", "completionTime": NOW - timedelta(seconds=30)}
    waiting = decide(job(finished, runPolicy={"ttlSecondsAfterFinished": 60}), [], NOW)
    assert waiting.actions == ()
    assert waiting.requeue_after == pytest.approx(30)
    due = decide(job(finished, runPolicy={"ttlSecondsAfterFinished": 20}), [], NOW)
    assert due.actions == (DeleteJob(),)


def test_finished_job_keeps_its_phase_and_cleans_late_pods() -> None:
    finished = {"phase": "Failed", "completionTime": NOW}
    decision = decide(job(finished), [pod(1)], NOW)
    assert decision.status.phase == "Failed"
    assert decision.actions == (delete(1),)
    assert decision.events == ()


def test_active_deadline() -> None:
    policy = {"activeDeadlineSeconds": 600, "cleanPodPolicy": "None"}
    early = decide(job(running(), runPolicy=policy), [pod(0), pod(1)], NOW)
    assert early.status.phase == "Running"
    assert early.requeue_after == pytest.approx(300)
    late = decide(job(running(), runPolicy=policy), [pod(0), pod(1)], NOW + timedelta(seconds=301))
    assert late.status.phase == "Failed"
    assert condition(late, "Failed") == ("True", "DeadlineExceeded")
    assert late.actions == (delete(0, 1),)  # past the deadline nothing keeps running


def test_suspend_and_resume_count_no_restart() -> None:
    suspended = decide(job(running(), runPolicy={"suspend": True}), [pod(0), pod(1)], NOW)
    assert suspended.status.phase == "Suspended"
    assert suspended.actions == (delete(0, 1),)
    assert condition(suspended, "Suspended") == ("True", "Suspended")
    status = suspended.status.model_dump(by_alias=True)
    resumed = decide(job(status), [], NOW)
    assert resumed.actions == (CreateWorkers(attempt=0, indices=(0, 1)),)
    assert resumed.status.restarts == 0
    assert resumed.status.phase == "Pending"
    assert condition(resumed, "Suspended") == ("False", "Resumed")


def test_created_suspended_creates_nothing() -> None:
    decision = decide(job(runPolicy={"suspend": True}), [], NOW)
    assert decision.actions == ()
    assert decision.status.phase == "Suspended"


def test_decisions_are_stable() -> None:
    """Deciding again on what was decided changes nothing and says nothing."""
    created = ("bar-worker-0", "bar-worker-1")
    cases = [
        (job(), [], created),  # just created: the watch has not shown the pods yet
        (job({"phase": "Pending"}), [pod(0), pod(1)], ()),
        (job(running()), [pod(0), pod(1, "Failed", exit_code=1)], ()),
    ]
    for start, pods, expected in cases:
        first = decide(start, pods, NOW)
        status = JobStatus.model_validate(first.status.model_dump(by_alias=True, exclude_none=True))
        second = decide(start.model_copy(update={"status": status}), pods, NOW, expected)
        assert second.status == first.status
        assert second.events == ()


def test_pod_view_reads_a_real_pod() -> None:
    raw = {
        "metadata": {
            "name": "bar-worker-1",
            "labels": {"kubeddp.io/replica-index": "1", "kubeddp.io/attempt": "2"},
            "ownerReferences": [{"kind": "DDPTrainingJob", "uid": UID, "controller": True}],
            "deletionTimestamp": "2026-11-22T12:00:00Z",
        },
        "spec": {"nodeName": "gpu-0"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "OOMKilled",
                            "finishedAt": "2026-11-22T11:00:00Z",
                        }
                    },
                }
            ],
        },
    }
    view = PodView.from_pod(raw)
    assert view == PodView(
        name="bar-worker-1",
        index=1,
        attempt=2,
        phase="Failed",
        deleting=True,
        exit_code=137,
        reason="OOMKilled",
        message=None,
        finished_at="2026-11-22T11:00:00Z",
        scheduled=True,
        owner_uid=UID,
        owner_kind="DDPTrainingJob",
        node="gpu-0",
        deletion_deadline="2026-11-22T12:00:00Z",
    )


def test_pod_view_reads_the_schedulers_verdict() -> None:
    raw = {
        "metadata": {"name": "bar-worker-0", "labels": {}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/5 nodes are available",
                }
            ],
        },
    }
    view = PodView.from_pod(raw)
    assert (view.scheduled, view.unschedulable, view.index) == (
        False,
        "0/5 nodes are available",
        -1,
    )


def test_pod_view_reads_a_pod_on_a_node_that_stopped_reporting() -> None:
    """What the node controller and the taint manager leave of a pod whose node went silent."""
    raw = {
        "metadata": {
            "name": "bar-worker-1",
            "labels": {},
            "deletionTimestamp": "2026-11-22T12:00:30Z",
        },
        "spec": {"nodeName": "cpu-3"},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-22T11:59:50Z"},
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByTaintManager",
                    "message": "Taint manager: deleting due to NoExecute taint",
                },
            ],
        },
    }
    view = PodView.from_pod(raw)
    assert (view.node, view.unready_since, view.deletion_deadline) == (
        "cpu-3",
        "2026-11-22T11:59:50Z",
        "2026-11-22T12:00:30Z",
    )
    assert (view.deleting, view.reason) == (True, "DeletionByTaintManager")


def test_pod_view_reads_a_disruption() -> None:
    """What the pod garbage collector leaves of a pod whose node is gone."""
    raw = {
        "metadata": {"name": "bar-worker-1", "labels": {}},
        "status": {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists",
                }
            ],
            "containerStatuses": [{"name": "trainer", "state": {"running": {}}}],
        },
    }
    view = PodView.from_pod(raw)
    assert (view.phase, view.reason, view.exit_code) == ("Failed", "DeletionByPodGC", None)
    assert view.message == "PodGC: node no longer exists"


LAST_DATE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def test_times_at_the_ends_of_the_calendar_with_the_longest_durations_decide() -> None:
    """Every duration the spec allows, added to any time a status may hold: a decision, a
    requeue, never an OverflowError."""
    longest = {"activeDeadlineSeconds": MAX_SECONDS, "progressDeadlineSeconds": MAX_SECONDS}
    training = report(0) | {"updatedAt": LAST_DATE}
    status = running(training=training) | {"startTime": LAST_DATE}
    decision = decide(job(status, runPolicy=longest), STALL_PODS, NOW)
    assert decision.status.phase == "Running"
    assert decision.requeue_after is not None and decision.requeue_after > MAX_SECONDS
    finished = {"phase": "Succeeded", "completionTime": LAST_DATE}
    ttl = {"ttlSecondsAfterFinished": MAX_SECONDS}
    assert decide(job(finished, runPolicy=ttl), [], NOW).actions == ()
    ancient = {"phase": "Succeeded", "completionTime": datetime(1, 1, 1, tzinfo=UTC)}
    assert decide(job(ancient, runPolicy=ttl), [], NOW).actions == (DeleteJob(),)


@pytest.mark.parametrize(
    "run_policy",
    [
        {"activeDeadlineSeconds": MAX_SECONDS + 1},
        {"progressDeadlineSeconds": 10**15},
        {"ttlSecondsAfterFinished": 10**15},
        {"unreachableTolerationSeconds": 10**15},
    ],
)
def test_durations_past_ten_years_are_refused(run_policy: dict[str, int]) -> None:
    with pytest.raises(ValidationError, match="less than or equal to 315360000"):
        job(runPolicy=run_policy)


@pytest.mark.parametrize(
    "owner",
    [{"owner_uid": None, "owner_kind": None}, {"owner_uid": UID, "owner_kind": "ReplicaSet"}],
    ids=["no owner", "another kind's"],
)
def test_a_pod_labelled_as_a_worker_is_not_one_unless_the_job_controls_it(
    owner: dict[str, Any],
) -> None:
    """Labels make no pod a worker: one that exits 0 under worker 0's labels ends nothing,
    and, not the job's, is not the job's to delete."""
    impostor = pod(0, "Succeeded", exit_code=0, **owner)
    decision = decide(job(running()), [impostor, pod(1)], NOW)
    assert decision.status.phase != "Succeeded"
    deleted = [n for a in decision.actions if isinstance(a, DeletePods) for n in a.names]
    assert impostor.name not in deleted
