"""Restarts in place as tables (docs/design.md, "Failure rules"): the agents' reports counted once,
a lost worker other than worker 0 replaced alone under the same attempt, and what still restarts
the whole group."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from kube_ddp.reasons import Reason
from kube_ddp.status import CreateWorkers, DeletePods, PodView, decide
from tests.unit.test_status import NOW, condition, delete, pod, running
from tests.unit.test_status import job as recreated_job

CREATED = (NOW - timedelta(minutes=4)).isoformat()  # the group's pods
RESTARTED_AT = NOW - timedelta(seconds=5)


def job(status: dict[str, Any] | None = None, **spec: Any) -> Any:
    """A trainer job that restarts in place (the default for the trainer image)."""
    spec["runPolicy"] = {"restartStrategy": "InPlace", **spec.get("runPolicy", {})}
    return recreated_job(status, **spec)


def up(index: int, attempt: int = 2, **fields: Any) -> PodView:
    """A running worker of the group, created with it."""
    fields.setdefault("created_at", CREATED)
    return pod(index, "Running", attempt=attempt, **fields)


def report(count: int = 1, attempt: int = 2, **fields: Any) -> dict[str, Any]:
    """status.rankRestart as an agent writes it: rank 3 in worker 1 was SIGKILLed."""
    return {
        "attempt": attempt,
        "count": count,
        "time": RESTARTED_AT,
        "pod": "bar-worker-1",
        "node": "n1",
        "rank": 3,
        "exitCode": 137,
        "message": "rank 3 was killed by SIGKILL",
        **fields,
    }


def attempt2(**extra: Any) -> dict[str, Any]:
    """A job on its attempt 2 (two group restarts so far, unless `restarts` says more), whose
    rank 0 reported progress a minute before the restart."""
    training = {"epoch": 1, "updatedAt": RESTARTED_AT - timedelta(minutes=1)}
    return {**running(2, attempt=2, training=training), **extra}


# --- the agents' reports ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportCase:
    id: str
    status: dict[str, Any]
    restarts: int  # after the decision
    said: bool  # a RestartedInPlace Event
    pods: tuple[PodView, ...] = field(default_factory=lambda: (up(0), up(1)))


REPORTS = [
    ReportCase("a new report: counted", attempt2(rankRestart=report()), 3, said=True),
    ReportCase(
        "the same report again: counted once",
        attempt2(rankRestart=report(), inPlaceRestarts=1, restarts=3),
        3,
        said=False,
    ),
    ReportCase(
        "two restarts since the last look: both counted",
        attempt2(rankRestart=report(count=3), inPlaceRestarts=1, restarts=3),
        5,
        said=True,
    ),
    ReportCase(
        "a report of an earlier attempt: not this group's",
        attempt2(rankRestart=report(attempt=1)),
        2,
        said=False,
    ),
    ReportCase(
        "a report older than worker 0's pod: a group of the same attempt before a preemption",
        attempt2(rankRestart=report(time=NOW - timedelta(minutes=10))),
        2,
        said=False,
    ),
]


@pytest.mark.parametrize("case", REPORTS, ids=[c.id for c in REPORTS])
def test_the_agents_restarts_in_place_are_counted_once(case: ReportCase) -> None:
    decision = decide(job(case.status, runPolicy={"backoffLimit": 6}), list(case.pods), NOW)
    assert decision.status.restarts == case.restarts
    assert decision.status.attempt == 2  # the pods are kept: the same attempt
    assert decision.actions == ()
    events = [e for e in decision.events if e.reason == Reason.RESTARTED_IN_PLACE]
    assert bool(events) == case.said
    if case.said:
        assert events[0].type == "Warning"
        assert "rank 3 (pod bar-worker-1) exited with code 137" in events[0].message
        assert f"(restart {case.restarts} of at most 6)" in events[0].message
        failure = decision.status.failure
        assert failure is not None
        assert (failure.pod, failure.exit_code, failure.reason) == (
            "bar-worker-1",
            137,
            "RestartedInPlace",
        )
        assert condition(decision, "Restarting") == ("True", "RestartedInPlace")
        assert decision.status.phase == "Running"


def test_restarting_lasts_until_rank_0_reports_progress_again() -> None:
    counted = decide(job(attempt2(rankRestart=report())), [up(0), up(1)], NOW)
    status = counted.status.model_dump(by_alias=True)
    assert condition(counted, "Restarting") == ("True", "RestartedInPlace")
    stale = {**status, "training": {"epoch": 1, "updatedAt": RESTARTED_AT - timedelta(seconds=1)}}
    assert condition(decide(job(stale), [up(0), up(1)], NOW), "Restarting") == (
        "True",
        "RestartedInPlace",
    )
    fresh = {**status, "training": {"epoch": 1, "updatedAt": NOW}}
    back = decide(job(fresh), [up(0), up(1)], NOW)
    assert condition(back, "Restarting") == ("False", "WorkersRunning")
    assert back.status.restarts == 3  # not counted again


def test_restarts_in_place_past_the_backoff_limit_fail_the_job() -> None:
    status = attempt2(rankRestart=report(count=2), inPlaceRestarts=1, restarts=3)
    decision = decide(job(status, runPolicy={"backoffLimit": 3}), [up(0), up(1)], NOW)
    assert decision.status.phase == "Failed"
    assert condition(decision, "Failed") == ("True", "BackoffLimitExceeded")
    assert decision.actions == (delete(0, 1),)  # cleanPodPolicy Running


# --- a lost worker: replaced alone, or the group restarts ----------------------------------------


@dataclass(frozen=True)
class LossCase:
    id: str
    pods: tuple[PodView, ...]
    actions: tuple[Any, ...]
    restarts: int = 3
    preemptions: int = 0
    reason: str = Reason.WORKER_REPLACED  # the Event's
    run_policy: dict[str, Any] = field(default_factory=dict)


def successor(index: int, name: str) -> CreateWorkers:
    """The successor of worker `index`, created at once under `name`."""
    return CreateWorkers(2, (index,), (name,))


# While the lost pod holds the worker's first name, its successor takes the next free one.
SECOND_NAME = successor(1, "bar-worker-1-r1")
EVICTED = {"reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}
LOSSES = [
    LossCase(
        "worker 1 gone before any look saw it end: taken while it ran, a preemption",
        (up(0),),
        (successor(1, "bar-worker-1"),),
        restarts=2,
        preemptions=1,
        reason=Reason.PREEMPTED,
    ),
    LossCase(
        "worker 1 evicted: its pod deleted first",
        (up(0), pod(1, "Failed", attempt=2, exit_code=137, **EVICTED)),
        (delete(1), SECOND_NAME),
    ),
    LossCase(
        "worker 1 OOM-killed as a container",
        (up(0), pod(1, "Failed", attempt=2, exit_code=137, reason="OOMKilled")),
        (delete(1), SECOND_NAME),
    ),
    LossCase(
        "worker 1's node lost: a pod already going; its successor prefers another node",
        (up(0), pod(1, "Unknown", attempt=2, deleting=True, node="n1")),
        (CreateWorkers(2, (1,), ("bar-worker-1-r1",), avoid_nodes=("n1",)),),
    ),
    LossCase(
        "worker 1's agent gave up on the rendezvous (88)",
        (up(0), pod(1, "Failed", attempt=2, exit_code=88, reason="Error")),
        (delete(1), SECOND_NAME),
    ),
    LossCase(
        "worker 1 saved on SIGTERM alone (86): a preemption, not a restart",
        (
            up(0),
            pod(1, "Failed", attempt=2, exit_code=86, deleting=True, reason="Error"),
        ),
        (SECOND_NAME,),
        restarts=2,
        preemptions=1,
        reason=Reason.PREEMPTED,
    ),
    LossCase(
        "worker 1 being deleted while it runs: replaced at once, a preemption",
        (up(0), up(1, deleting=True)),
        (SECOND_NAME,),
        restarts=2,
        preemptions=1,
        reason=Reason.PREEMPTED,
    ),
    LossCase(
        "worker 1 evicted while it runs: Kubernetes' reason kept",
        (up(0), up(1, deleting=True, **EVICTED)),
        (SECOND_NAME,),
        restarts=2,
        preemptions=1,
        reason=Reason.PREEMPTED,
    ),
]


@pytest.mark.parametrize("case", LOSSES, ids=[c.id for c in LOSSES])
def test_a_lost_worker_other_than_worker_0_is_replaced_alone(case: LossCase) -> None:
    decision = decide(job(attempt2(), runPolicy=case.run_policy), list(case.pods), NOW)
    assert decision.actions == case.actions  # worker 0 is never touched
    assert decision.status.attempt == 2
    assert decision.status.restarts == case.restarts
    assert decision.status.preemptions == case.preemptions
    assert decision.status.replacing == [1]
    assert case.reason in [e.reason for e in decision.events]
    assert decision.status.phase not in ("Restarting", "Failed")


def test_workers_deleted_while_no_operator_watched_count_as_a_look_would() -> None:
    """Workers 1 and 2 of an in-place job deleted while the leader was being replaced, seen by
    the next one only as gone: preemptions, as deletions seen going are, so backoffLimit 1 is
    not reached. Under restartPolicy Never the job fails, and preemptions stay 0."""
    stopped = attempt2(restarts=0)
    going = [up(0), up(1, deleting=True), up(2, deleting=True)]
    seen = decide(job(stopped, nodes=3), going, NOW)
    unseen = decide(job(stopped, nodes=3, runPolicy={"backoffLimit": 1}), [up(0)], NOW)
    for decision in (seen, unseen):
        assert (decision.status.restarts, decision.status.preemptions) == (0, 2)
        assert decision.status.replacing == [1, 2]
        assert decision.status.phase not in ("Restarting", "Failed")
    assert "bar-worker-1 was deleted, its end unseen (Deleted: the pod was deleted)" in (
        unseen.events[0].message
    )
    never = decide(job(stopped, nodes=3, runPolicy={"restartPolicy": "Never"}), [up(0)], NOW)
    assert (never.status.phase, never.status.preemptions) == ("Failed", 0)


def test_more_losses_at_once_than_the_limit_has_left_fail_saying_so() -> None:
    """Workers 1 and 2 on one lost node, backoffLimit 1: each counts, and two replacements
    would pass the limit, so the job fails having made none, and says so."""
    lost = [up(0), *(pod(i, "Failed", attempt=2, exit_code=137) for i in (1, 2))]
    decision = decide(job(attempt2(restarts=0), nodes=3, runPolicy={"backoffLimit": 1}), lost, NOW)
    assert (decision.status.phase, decision.status.restarts) == ("Failed", 0)
    failed = next(c for c in decision.status.conditions if c.type == "Failed")
    assert failed.message == (
        "bar-worker-1 exited with code 137 (Error), with 1 more worker(s) at once; replacing "
        "them all would pass backoffLimit 1 (0 restart(s) so far)"
    ), failed.message


def test_a_replacement_goes_on_without_counting_again() -> None:
    replacing = attempt2(restarts=3, replacing=[1])
    going = pod(1, "Failed", attempt=2, exit_code=137, deleting=True, **EVICTED)
    goes_on = decide(job(replacing), [up(0), going], NOW)
    assert (goes_on.actions, goes_on.status.restarts) == ((SECOND_NAME,), 3)
    gone = decide(job(replacing), [up(0)], NOW)
    assert gone.actions == (successor(1, "bar-worker-1"),)
    assert (gone.status.restarts, gone.status.replacing) == (3, [1])
    back = decide(job(replacing), [up(0), pod(1, "Pending", attempt=2)], NOW)
    assert (back.actions, back.status.restarts, back.status.replacing) == ((), 3, [])


def test_only_workers_of_the_job_other_than_worker_0_are_replaced() -> None:
    """status.replacing as read may hold what the operator never wrote (an operator that has
    just started reads what a worker's token forged): indices past nodes-1 are dropped,
    never made pods."""
    forged = attempt2(restarts=3, replacing=[1, 2, 7, 41])
    decision = decide(job(forged), [up(0)], NOW)
    assert decision.actions == (successor(1, "bar-worker-1"),)
    assert decision.status.replacing == [1]


def test_a_new_loss_beside_a_replacement_under_way_creates_each_successor_once() -> None:
    replacing = attempt2(restarts=2, replacing=[1])
    oom = pod(2, "Failed", attempt=2, exit_code=137, reason="OOMKilled")
    decision = decide(job(replacing, nodes=3), [up(0), oom], NOW)
    created = [a for a in decision.actions if isinstance(a, CreateWorkers)]
    assert created == [successor(1, "bar-worker-1"), successor(2, "bar-worker-2-r1")]
    assert (decision.status.restarts, decision.status.replacing) == (3, [1, 2])


def test_a_successor_created_and_not_seen_yet_is_the_worker() -> None:
    """Expected (its create returned, the watch has not shown it): it stands for the worker,
    and no second successor is made beside the lost pod still going."""
    going = pod(1, "Failed", attempt=2, exit_code=137, deleting=True, **EVICTED)
    replacing = attempt2(restarts=3, replacing=[1])
    decision = decide(job(replacing), [up(0), going], NOW, expected=["bar-worker-1-r1"])
    assert (decision.actions, decision.status.restarts, decision.status.replacing) == ((), 3, [])


def test_a_successor_takes_the_first_name_no_pod_holds() -> None:
    """Back to the first name once it is free; past a second name still held."""
    lost = pod(1, "Failed", attempt=2, exit_code=137, reason="OOMKilled", created_at=CREATED)
    second = dataclasses.replace(lost, name="bar-worker-1-r1")
    for pods, name in (
        ([up(0), second], "bar-worker-1"),
        ([up(0), second, dataclasses.replace(lost, deleting=True)], "bar-worker-1-r2"),
    ):
        decision = decide(job(attempt2()), pods, NOW)
        assert decision.actions[-1] == successor(1, name), pods


def test_a_pod_being_deleted_waits_for_its_end_where_that_decides() -> None:
    """Recreate, restartPolicy Never, or worker 0: how the rank ends (saved or not) decides
    between resuming, restarting and failing, so nothing is done before it ends."""
    taken = up(1, deleting=True)
    for decision in (
        decide(recreated_job(attempt2()), [up(0), taken], NOW),
        decide(job(attempt2(), runPolicy={"restartPolicy": "Never"}), [up(0), taken], NOW),
        decide(job(attempt2()), [up(0, deleting=True), up(1)], NOW),
    ):
        assert (decision.actions, decision.status.phase) == ((), "Running")
        assert (decision.status.restarts, decision.status.preemptions) == (2, 0)


def test_a_lost_pod_is_deleted_only_as_the_pod_it_was() -> None:
    """By its uid: by the time the delete reaches the API server, the name may be its
    successor's (the watch of one pod can lag behind another's)."""
    lost = pod(1, "Failed", attempt=2, exit_code=137, uid="uid-lost", **EVICTED)
    decision = decide(job(attempt2()), [up(0), lost], NOW)
    assert decision.actions == (DeletePods(("bar-worker-1",), uids=("uid-lost",)), SECOND_NAME)


def test_a_lost_pod_seen_beside_its_successor_is_not_lost_again() -> None:
    """The old pod's last events may be read after its successor's first: the newest pod of a
    worker is the worker, and the old one is neither counted nor deleted again."""
    replaced = attempt2(restarts=3)
    lost = pod(1, "Failed", attempt=2, exit_code=137, deleting=True, uid="old", **EVICTED)
    successor = up(1, uid="new", created_at=NOW.isoformat())
    for pods in ([up(0), lost, successor], [up(0), successor, lost]):
        decision = decide(job(replaced), pods, NOW)
        assert (decision.actions, decision.status.restarts) == ((), 3)
        assert decision.status.replacing == []
        assert decision.status.workers is not None and decision.status.workers.running == 2


@dataclass(frozen=True)
class GroupCase:
    id: str
    pods: tuple[PodView, ...]
    status: dict[str, Any] = field(default_factory=attempt2)
    run_policy: dict[str, Any] = field(default_factory=dict)
    phase: str = "Restarting"
    reason: str = Reason.WORKER_FAILED


GROUP = [
    GroupCase("worker 0 lost: its agent held the store", (up(1),)),
    GroupCase(
        "worker 0 evicted",
        (pod(0, "Failed", attempt=2, exit_code=137, **EVICTED), up(1)),
    ),
    GroupCase(
        "a hang: no progress for progressDeadlineSeconds",
        (up(0), up(1)),
        status=attempt2(training={"epoch": 1, "updatedAt": NOW - timedelta(seconds=120)}),
        run_policy={"progressDeadlineSeconds": 60},
        reason=Reason.PROGRESS_DEADLINE_EXCEEDED,
    ),
    GroupCase(
        "worker 1's node lost, worker 0 on it too: its eviction is on the way",
        (
            up(0, node="n1"),
            pod(1, "Unknown", attempt=2, deleting=True, node="n1", created_at=CREATED),
        ),
        reason=Reason.WORKER_FAILED,
    ),
    GroupCase(
        "worker 1 failed with a code that does not restart",
        (up(0), pod(1, "Failed", attempt=2, exit_code=1, reason="Error")),
        phase="Failed",
        reason=Reason.NON_RETRYABLE_EXIT_CODE,
    ),
    GroupCase(
        "restartPolicy Never: a lost worker fails the job",
        (up(0),),
        run_policy={"restartPolicy": "Never"},
        phase="Failed",
    ),
    GroupCase(
        "no restarts left: replacing one would pass backoffLimit",
        (up(0), pod(1, "Failed", attempt=2, exit_code=137, reason="OOMKilled")),
        status=attempt2(restarts=3),
        phase="Failed",
        reason=Reason.BACKOFF_LIMIT_EXCEEDED,
    ),
]


@pytest.mark.parametrize("case", GROUP, ids=[c.id for c in GROUP])
def test_what_still_restarts_the_group_or_fails(case: GroupCase) -> None:
    decision = decide(job(case.status, runPolicy=case.run_policy), list(case.pods), NOW)
    assert decision.status.phase == case.phase
    assert case.reason in [e.reason for e in decision.events]
    if case.phase == "Restarting":
        assert decision.status.attempt == 3  # the next attempt: new pods, a new port
        assert decision.status.restarts == 3
        assert any(isinstance(a, DeletePods) for a in decision.actions)
    else:
        assert decision.status.attempt == 2


def test_an_elastic_job_short_of_a_worker_keeps_running() -> None:
    spec = {"nodes": 3, "elastic": {"minNodes": 2, "maxNodes": 3}}
    lost = decide(job(attempt2(), **spec), [up(0), up(1)], NOW)
    assert lost.actions == (successor(2, "bar-worker-2"),)
    assert lost.status.phase == "Running"
    assert lost.status.replacing == [2]
    waiting = decide(job(lost.status.model_dump(by_alias=True), **spec), [up(0), up(1)], NOW)
    assert waiting.status.phase == "Running"
    running_message = [c.message for c in waiting.status.conditions if c.type == "Running"]
    assert running_message == ["2 of 3 workers are running (elastic: at least 2)"]


def test_a_recreate_job_restarts_the_group_for_the_same_loss() -> None:
    decision = decide(recreated_job(attempt2()), [up(0)], NOW)
    assert decision.status.phase == "Restarting"
    assert decision.status.attempt == 3


def test_a_node_a_worker_was_lost_to_is_avoided_for_a_while_then_preferred_again() -> None:
    """NodeLost or an eviction under node pressure: status.avoidedNodes says so, the next
    pods carry it for AVOID_NODE_SECONDS, and it goes once past; a program's own failure
    avoids nothing."""
    pressure = {"reason": "Evicted", "message": "The node was low on resource: memory."}
    lost = decide(job(attempt2()), [up(0), pod(1, "Failed", attempt=2, node="n1", **pressure)], NOW)
    assert [(a.node, a.reason) for a in lost.status.avoided_nodes] == [("n1", "Evicted")]
    assert lost.status.avoided_nodes[0].until == NOW + timedelta(seconds=600)
    assert "the next pods prefer nodes other than n1 for 10 min" in (
        next(e.message for e in lost.events if e.reason == Reason.WORKER_REPLACED)
    )
    said = lost.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    gone = decide(job(said), [up(0)], NOW)
    assert gone.actions == (CreateWorkers(2, (1,), ("bar-worker-1",), avoid_nodes=("n1",)),)
    later = decide(job(said), [up(0)], NOW + timedelta(seconds=601))
    assert later.actions == (successor(1, "bar-worker-1"),)
    crashed = pod(1, "Failed", attempt=2, node="n1", exit_code=137, reason="Error")
    assert decide(job(attempt2()), [up(0), crashed], NOW).status.avoided_nodes == []
