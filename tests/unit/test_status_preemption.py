"""Preemption as tables: a group stopped from outside (its workers saved a checkpoint on SIGTERM
and exited 86, or the job was suspended) resumes without counting a restart, and status says
when, by what, and from which step (docs/design.md, "Preemption")."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from kube_ddp import builders, names
from kube_ddp.launchers.torchrun import build_worker_pod
from kube_ddp.reasons import Reason
from kube_ddp.status import CreateWorkers, DeleteMPIJob, DeletePods, PodView, decide
from tests.unit.test_builders import SETTINGS as BUILD_SETTINGS
from tests.unit.test_status import NOW, condition, delete, job, pod, running
from tests.unit.test_status_mpi import launcher, mpi_job, mpijob, started, worker

PREEMPTED = names.EXIT_PREEMPTED
ENDED = "2026-11-22T11:59:58Z"
EVICTION = {"reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}


def saved(index: int, *, deleting: bool = True, **fields: Any) -> PodView:
    """Worker `index` after it saved a checkpoint on SIGTERM and exited 86."""
    fields.setdefault("finished_at", ENDED)
    fields.setdefault("reason", "Error")  # the kubelet's, for any non-zero exit
    return pod(index, "Failed", exit_code=PREEMPTED, deleting=deleting, **fields)


@dataclass(frozen=True)
class PreemptionCase:
    id: str
    pods: tuple[PodView, ...]
    by: str  # lastPreemption.reason
    status: dict[str, Any] = field(default_factory=running)
    run_policy: dict[str, Any] = field(default_factory=dict)
    deleted: tuple[int, ...] = (0,)  # what the group's stop deletes (not those already going)


PREEMPTIONS = [
    PreemptionCase(
        "a drain: evicted through the Eviction API",
        (pod(0), saved(1, **EVICTION)),
        "EvictionByEvictionAPI",
    ),
    PreemptionCase(
        "the scheduler, for a higher priority pod",
        (pod(0), saved(1, reason="PreemptionByScheduler", message="preempted by ns/big")),
        "PreemptionByScheduler",
    ),
    PreemptionCase(
        "a NoExecute taint",
        (pod(0), saved(1, reason="DeletionByTaintManager", message="Taint manager: deleting")),
        "DeletionByTaintManager",
    ),
    PreemptionCase(
        "the kubelet's graceful node shutdown",
        (pod(0), saved(1, deleting=False, reason="TerminationByKubelet")),
        "TerminationByKubelet",
        deleted=(0, 1),
    ),
    PreemptionCase("a plain kubectl delete", (pod(0), saved(1)), "Deleted"),
    PreemptionCase(
        "a SIGTERM Kubernetes gave no reason for",
        (pod(0), saved(1, deleting=False)),
        "Terminated",
        deleted=(0, 1),
    ),
    PreemptionCase(
        "the rank told by its peer ended first: the evicted one still says why",
        (saved(0, deleting=False, finished_at="2026-11-22T11:59:57Z"), saved(1, **EVICTION)),
        "EvictionByEvictionAPI",
        deleted=(0,),
    ),
    PreemptionCase(
        "restartPolicy Never and backoffLimit 0: not a failure",
        (pod(0), saved(1, **EVICTION)),
        "EvictionByEvictionAPI",
        run_policy={"restartPolicy": "Never", "backoffLimit": 0},
    ),
    PreemptionCase(
        "no restarts left, the 8th preemption: never failed for it",
        (pod(0, attempt=3), saved(1, attempt=3, **EVICTION)),
        "EvictionByEvictionAPI",
        status=running(3, preemptions=7),
        run_policy={"backoffLimit": 3},
    ),
]


@pytest.mark.parametrize("case", PREEMPTIONS, ids=[case.id for case in PREEMPTIONS])
def test_a_preempted_group_resumes_uncounted(case: PreemptionCase) -> None:
    before = job(case.status, runPolicy=case.run_policy)
    decision = decide(before, list(case.pods), NOW)
    status = decision.status
    assert status.phase == "Restarting"
    assert status.restarts == case.status["restarts"]
    assert status.failure is None
    assert status.preemptions == case.status.get("preemptions", 0) + 1
    assert status.last_preemption is not None
    assert (status.last_preemption.time, status.last_preemption.reason) == (NOW, case.by)
    assert condition(decision, "Restarting") == ("True", Reason.PREEMPTED)
    assert decision.actions == (delete(*case.deleted),)
    assert [(e.type, e.reason) for e in decision.events] == [("Normal", Reason.PREEMPTED)]
    assert f"preempted ({case.by})" in decision.events[0].message


def test_the_preemption_says_the_pod_and_the_checkpoint() -> None:
    checkpoint = {"step": 1200, "epoch": 3, "savedAt": NOW, "saveSeconds": 4.0}
    status = running(training={"step": 14, "checkpoint": checkpoint})
    decision = decide(job(status), [pod(0), saved(1, **EVICTION)], NOW)
    last = decision.status.last_preemption
    assert last is not None
    assert (last.message, last.checkpoint_step) == ("bar-worker-1: Eviction API: evicting", 1200)
    assert decision.events[0].message == (
        "bar-worker-1 exited with code 86 (it saved a checkpoint on SIGTERM and stopped) "
        "(EvictionByEvictionAPI: Eviction API: evicting); preempted (EvictionByEvictionAPI), "
        "resuming the group from its checkpoint (preemption 1, not counted as a restart)"
    )


def test_a_worker_being_deleted_is_waited_for_while_it_saves() -> None:
    going = pod(1, deleting=True, deletion_deadline="2026-11-22T12:00:20Z", **EVICTION)
    decision = decide(job(running()), [pod(0), going], NOW)
    assert decision.status.phase == "Running"
    assert decision.actions == ()
    assert decision.status.preemptions == 0


def test_the_next_group_starts_once_the_stopped_one_is_gone() -> None:
    stopped = decide(job(running()), [pod(0), saved(1, **EVICTION)], NOW).status
    status = stopped.model_dump(by_alias=True)
    going = [pod(0, deleting=True), saved(1, **EVICTION)]
    waiting = decide(job(status), going, NOW + timedelta(seconds=1))
    assert (waiting.status.phase, waiting.actions) == ("Restarting", ())
    late = [pod(0, "Failed", exit_code=PREEMPTED)]  # deleted, not yet shown so by the watch
    assert decide(job(status), late, NOW).actions == (delete(0),)
    resumed = decide(job(status), [], NOW + timedelta(seconds=2))
    assert resumed.actions == (CreateWorkers(attempt=0, indices=(0, 1)),)
    assert resumed.status.phase == "Pending"
    assert (resumed.status.restarts, resumed.status.preemptions) == (0, 1)
    # the new group's pods are no preemption of their own
    status = resumed.status.model_dump(by_alias=True)
    again = decide(job(status), [pod(0, "Pending"), pod(1, "Pending")], NOW)
    assert (again.status.phase, again.status.preemptions) == ("Pending", 1)


def test_the_step_the_next_attempt_resumed_from_is_said_once_reported() -> None:
    last = {"time": NOW - timedelta(minutes=2), "reason": "Suspended"}
    created = (NOW - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    workers = [pod(0, created_at=created), pod(1, created_at=created)]

    def after(report_age: timedelta, said: int | None = None) -> int | None:
        training = {"resumedFromStep": 1200, "updatedAt": NOW - report_age}
        copied = {**last, "resumedFromStep": said}
        status = running(preemptions=1, lastPreemption=copied, training=training)
        decision = decide(job(status), workers, NOW)
        assert decision.status.last_preemption is not None
        return decision.status.last_preemption.resumed_from_step

    assert after(timedelta(minutes=3)) is None  # the stopped attempt's report
    assert after(timedelta(seconds=10)) == 1200
    # the field the attempt before left in the merge-patched report, then this attempt's own
    assert after(timedelta(seconds=10), said=0) == 1200


def test_a_suspend_of_a_running_group_is_a_preemption() -> None:
    suspended = decide(job(running(), runPolicy={"suspend": True}), [pod(0), pod(1)], NOW)
    status = suspended.status
    assert (status.phase, status.restarts, status.preemptions) == ("Suspended", 0, 1)
    assert status.last_preemption is not None
    assert status.last_preemption.reason == Reason.SUSPENDED
    # its pods exiting 86 meanwhile are no failure, and it is counted once
    later = job(status.model_dump(by_alias=True), runPolicy={"suspend": True})
    again = decide(later, [saved(0), saved(1)], NOW + timedelta(seconds=5))
    assert (again.status.phase, again.status.preemptions, again.status.failure) == (
        "Suspended",
        1,
        None,
    )


def test_a_queue_that_takes_the_quota_back_is_said() -> None:
    why = (Reason.PREEMPTED, "Preempted to accommodate a workload (UID: w1) due to priority")
    decision = decide(job(running(), runPolicy={"suspend": True}), [pod(0)], NOW, suspended_by=why)
    last = decision.status.last_preemption
    assert last is not None and (last.reason, last.message) == why


def test_a_job_queued_from_the_start_is_not_preempted() -> None:
    why = (Reason.QUEUED, "waiting in LocalQueue team-a")
    decision = decide(job(runPolicy={"suspend": True}), [], NOW, suspended_by=why)
    assert (decision.status.phase, decision.status.preemptions) == ("Suspended", 0)


def test_mpirun_exiting_86_resumes_the_mpijob_uncounted() -> None:
    saved_launcher = launcher("Failed", exit_code=PREEMPTED, finished_at=ENDED)
    pods = [saved_launcher, worker(0), worker(1)]
    decision = decide(mpi_job(started()), pods, NOW, mpijob=mpijob(0, "Running"))
    assert decision.status.phase == "Restarting"
    assert (decision.status.restarts, decision.status.preemptions) == (0, 1)
    assert decision.actions == (DeleteMPIJob("bar"),)
    assert condition(decision, "Restarting") == ("True", Reason.PREEMPTED)


@dataclass(frozen=True)
class GraceCase:
    id: str
    own: int | None  # template.terminationGracePeriodSeconds
    save_seconds: float | None  # status.training.checkpoint.saveSeconds
    grace: int | None


GRACES = [
    GraceCase("nothing measured, nothing set: Kubernetes' default stands", None, None, None),
    GraceCase("nothing measured: the template's", 5, None, 5),
    GraceCase("a quick save: Kubernetes' 30 s", None, 1.0, 30),
    GraceCase("a 10 s save: 2 x 10 + 15", None, 10.0, 35),
    GraceCase("a 40.2 s save, rounded up", 5, 40.2, 96),
    GraceCase("the template's when longer", 600, 10.0, 600),
]


@pytest.mark.parametrize("case", GRACES, ids=[case.id for case in GRACES])
def test_the_grace_period_fits_the_last_save(case: GraceCase) -> None:
    status = running()
    if case.save_seconds is not None:
        status["training"] = {"checkpoint": {"step": 10, "saveSeconds": case.save_seconds}}
    template = {} if case.own is None else {"terminationGracePeriodSeconds": case.own}
    the_job = job(status, template=template)
    assert builders.termination_grace_seconds(the_job) == case.grace
    worker_pod = build_worker_pod(the_job, 0, 0, BUILD_SETTINGS)
    assert worker_pod["spec"].get("terminationGracePeriodSeconds") == case.grace
    suspended = job(status, template=template, runPolicy={"suspend": True})
    deletes = decide(suspended, [pod(0)], NOW).actions
    assert deletes == (DeletePods(("bar-worker-0",), grace_seconds=case.grace),)
