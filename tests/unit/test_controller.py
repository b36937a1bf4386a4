"""The operator's shell in-process: `Controller.reconcile` and `Kube` against a fake API server.

What is checked is what the shell adds to the pure core: the requests it makes, in which order,
and what it does with the API server's answers (409 and 404 as success, 400/422 and a missing
MPIJob kind as Failed, one re-authentication on 401, backoff on errors), the newest-body rule of
the job cache, expectations, and writing the status only when it changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from kube_ddp.config import OperatorConfig
from kube_ddp.controller import (
    MPI_OPERATOR_MISSING,
    Controller,
    Expectations,
    JobCache,
    Key,
    WaitingForRoomError,
    retry_delay,
)
from kube_ddp.kube import ApiError, UnauthorizedError
from kube_ddp.reasons import Reason
from kube_ddp.status import PodView
from tests.unit.fake_api import FakeApi, kube_for, serving

NAMESPACE, NAME = "ns1", "bar"
KEY: Key = (NAMESPACE, NAME)
UID = "uid-1"
PODS = "/api/v1/namespaces/ns1/pods"
STATUS = "/apis/kubeddp.io/v1alpha1/namespaces/ns1/ddptrainingjobs/bar/status"


def job_body(
    status: dict[str, Any] | None = None, resource_version: int = 10, **spec: Any
) -> dict[str, Any]:
    """A job as the API server returns it."""
    return {
        "apiVersion": "kubeddp.io/v1alpha1",
        "kind": "DDPTrainingJob",
        "metadata": {
            "name": NAME,
            "namespace": NAMESPACE,
            "uid": UID,
            "generation": 1,
            "resourceVersion": str(resource_version),
            "creationTimestamp": "2026-11-22T12:00:00Z",
        },
        "spec": {"nodes": 2, **spec},
        "status": status or {},
    }


def pod(index: int, phase: str = "Running", attempt: int = 0, **fields: Any) -> PodView:
    return PodView(
        name=f"bar-worker-{index}",
        index=index,
        attempt=attempt,
        phase=phase,
        scheduled=True,
        owner_uid=UID,
        owner_kind="DDPTrainingJob",
        **fields,
    )


Scenario = Callable[[FakeApi, Controller], Awaitable[None]]


def run(scenario: Scenario, api: FakeApi | None = None, tokens: list[str] | None = None) -> FakeApi:
    """Run `scenario` with a controller talking to a fake API server; the server is returned
    with what it recorded."""
    fake = api or FakeApi()

    async def main() -> None:
        async with serving(fake):
            controller = Controller(config=OperatorConfig(), kube=kube_for(fake, tokens), pods={})
            try:
                await scenario(fake, controller)
            finally:
                await controller.queue.close()
                await controller.kube.close()

    asyncio.run(main())
    return fake


def start(
    fake: FakeApi, controller: Controller, body: dict[str, Any], pods: list[PodView] = ()
) -> None:
    """The job as the watch delivered it, and its pods as the index holds them, to an operator
    that has just started (it has decided nothing of this job yet)."""
    controller.decided.pop(KEY, None)
    fake.put_job(body)
    controller.jobs.offer(KEY, copy.deepcopy(body))
    controller.pods = {KEY: list(pods)}


def written_statuses(fake: FakeApi) -> list[dict[str, Any]]:
    return [c.body["status"] for c in fake.made("PATCH", STATUS)]


def event_reasons(fake: FakeApi) -> list[str]:
    return [c.body["reason"] for c in fake.made("POST", "/events")]


def test_a_new_job_gets_its_children_then_a_status_and_an_event() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        await controller.reconcile(KEY)

    fake = run(scenario)
    created = [
        (c.path.rsplit("/", 1)[-1], c.body["metadata"].get("name")) for c in fake.made("POST")
    ]
    assert created == [
        ("services", "bar"),
        ("networkpolicies", "bar"),
        ("serviceaccounts", "bar-trainer"),
        ("roles", "bar-trainer"),
        ("rolebindings", "bar-trainer"),
        ("pods", "bar-worker-0"),
        ("pods", "bar-worker-1"),
        ("events", None),
    ]
    pods = fake.made("POST", PODS)
    assert {o["uid"] for p in pods for o in p.body["metadata"]["ownerReferences"]} == {UID}
    assert [s["phase"] for s in written_statuses(fake)] == ["Pending"]
    assert event_reasons(fake) == [Reason.WORKERS_CREATED]


def test_pods_not_yet_in_the_watch_are_expected_not_vanished() -> None:
    """Right after creating them the index has no pods: no restart, no second create."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)  # the cache holds our status write; the index is empty

    fake = run(scenario)
    assert len(fake.made("POST", PODS)) == 2
    assert fake.made("DELETE") == []
    assert all(s.get("restarts", 0) == 0 for s in written_statuses(fake))


def test_an_earlier_pods_last_event_does_not_stand_for_its_successor() -> None:
    """A worker's pod deleted and created again under its name: the old pod's DELETED event,
    read after the new pod's create (kopf keeps a queue per object), must not end the wait for
    the new one, which would be taken for vanished and cost a restart."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        await controller.reconcile(KEY)
        old = pod(0, uid="uid-of-the-old-pod", deleting=True)
        controller.pod_changed(KEY, old, 0.0)
        await controller.reconcile(KEY)
        assert [s.get("restarts", 0) for s in written_statuses(fake)] == [0]
        controller.pod_changed(KEY, pod(0, uid="uid-of-bar-worker-0", deleting=True), 0.0)
        await controller.reconcile(KEY)  # the new pod itself is gone: it vanished
        assert written_statuses(fake)[-1]["failure"]["pod"] == "bar-worker-0"

    fake = run(scenario)
    assert len(fake.made("POST", PODS)) == 2


def test_an_earlier_jobs_pod_of_the_same_name_does_not_stand_for_the_new_one() -> None:
    """A job deleted and made again under its name (a user's delete and apply): a late event
    of the earlier job's pod, still running when read (kopf keeps a queue per object), must not
    end the wait for the new job's pod of that name, which would be taken for vanished."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        await controller.reconcile(KEY)
        earlier = replace(pod(1, uid="uid-of-the-old-pod"), owner_uid="uid-of-the-earlier-job")
        controller.pod_changed(KEY, earlier, 0.0)
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert len(fake.made("POST", PODS)) == 2
    assert all(s.get("restarts", 0) == 0 for s in written_statuses(fake))
    assert all(s.get("preemptions", 0) == 0 for s in written_statuses(fake))
    assert all("failure" not in s for s in written_statuses(fake))


def test_an_earlier_jobs_deletion_read_late_leaves_the_new_job_of_its_name_alone() -> None:
    """kopf keeps a queue per object, so the DELETED event of a job deleted and made again under
    its name may be read after the new job created its pods: it must not drop what the
    operator keeps of the new job (its pods expected), which would read as vanished (the kwok
    soak, seed 323023: soak-009 and soak-050, worker 0 lost 230 ms after its create)."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        await controller.reconcile(KEY)
        controller.job_deleted(KEY, "uid-of-the-earlier-job")
        controller.job_changed(KEY, fake.jobs[STATUS.removesuffix("/status")])  # its next event
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert len(fake.made("POST", PODS)) == 2
    assert all(s.get("restarts", 0) == 0 for s in written_statuses(fake))
    assert all("failure" not in s for s in written_statuses(fake))


def test_before_its_create_returns_a_pod_is_told_by_the_job_and_attempt_it_was_made_for() -> None:
    """The watch may show the new pod before its create returns its uid: then an event ends
    the wait if the pod is of this job and attempt, not if it is of the last attempt's pod or
    of an earlier job's of the same name."""
    expectations = Expectations(timeout=60.0)
    expectations.expect(KEY, ["bar-worker-0"], now=0.0, made_for=(UID, 1))
    for earlier in (pod(0, attempt=0), replace(pod(0, attempt=1), owner_uid="an-earlier-job")):
        expectations.observe(KEY, "bar-worker-0", earlier)
        assert expectations.pending(KEY, now=1.0) == ["bar-worker-0"]
    expectations.observe(KEY, "bar-worker-0", pod(0, attempt=1, deleting=True))
    assert expectations.pending(KEY, now=1.0) == []


def test_the_status_is_written_only_when_it_changed() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body({"phase": "Starting"}), [pod(0), pod(1)])
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert [s["phase"] for s in written_statuses(fake)] == ["Running"]
    assert event_reasons(fake) == [Reason.WORKERS_RUNNING]


def test_the_trainers_progress_is_never_written_back() -> None:
    training = {"epoch": 3, "valAccuracy": 0.9}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        status = {"phase": "Starting", "training": training}
        start(fake, controller, job_body(status), [pod(0), pod(1)])
        await controller.reconcile(KEY)

    fake = run(scenario)
    (written,) = written_statuses(fake)
    assert "training" not in written
    assert fake.jobs[STATUS.removesuffix("/status")]["status"]["training"] == training


def test_a_new_failure_replaces_the_last_one_whole() -> None:
    """status.failure says one failure: a field the new one lacks (the node of a vanished pod,
    the exit code of a lost one) is removed, not left from the last (a merge patch keeps what
    it does not name)."""
    last = {"pod": "bar-worker-1", "node": "n1", "exitCode": 137, "reason": "Error"}
    status = {"phase": "Running", "startTime": "2026-11-22T12:00:00Z", "failure": last}
    status |= {"attempt": 1, "restarts": 1, "lastPreemption": {"reason": "Deleted"}}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body(status, runPolicy={"restartStrategy": "Recreate"}))
        controller.pods = {KEY: [pod(1, attempt=1)]}  # worker 0 gone unseen
        await controller.reconcile(KEY)

    fake = run(scenario)
    stored = fake.jobs[STATUS.removesuffix("/status")]["status"]
    assert stored["restarts"] == 2
    assert stored["failure"] == {
        "pod": "bar-worker-0",
        "reason": "Deleted",
        "message": "the pod was deleted",
    }
    assert stored["lastPreemption"] == {"reason": "Deleted"}  # what the decision kept, kept


@pytest.mark.parametrize(
    ("strategy", "said"),
    [("Recreate", Reason.WORKER_FAILED), ("InPlace", Reason.WORKER_REPLACED)],
)
def test_a_stale_watch_event_cannot_restart_the_group_twice(strategy: str, said: Reason) -> None:
    """After our status write (restarts 1), the watch may still deliver the job as it was
    before (restarts 0, a worker failed): the cache keeps the newer body. The same for a
    group restart and for a worker replaced alone."""
    failed = [pod(0), pod(1, "Failed", exit_code=137, reason="Error")]

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        status = {"phase": "Running", "startTime": "2026-11-22T12:00:00Z"}
        before = job_body(status, runPolicy={"restartStrategy": strategy})
        start(fake, controller, before, failed)
        await controller.reconcile(KEY)
        controller.jobs.offer(KEY, copy.deepcopy(before))  # the stale event
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert {s["restarts"] for s in written_statuses(fake)} == {1}
    assert event_reasons(fake).count(said) == 1  # a second restart would say it again


def test_the_job_cache_keeps_the_newest_resource_version() -> None:
    cache = JobCache()
    cache.offer(KEY, job_body(resource_version=11))
    cache.offer(KEY, job_body(resource_version=10))
    assert cache.get(KEY)["metadata"]["resourceVersion"] == "11"
    cache.offer(KEY, job_body(resource_version=12))
    assert cache.get(KEY)["metadata"]["resourceVersion"] == "12"


def test_the_job_cache_keeps_no_managed_fields() -> None:
    cache, body = JobCache(), job_body(resource_version=11)
    body["metadata"]["managedFields"] = [{"manager": "kube-ddp", "fieldsV1": {"f:status": {}}}]
    cache.offer(KEY, body)
    assert "managedFields" not in cache.get(KEY)["metadata"]
    assert cache.get(KEY)["metadata"]["resourceVersion"] == "11"
    assert cache.get(KEY)["spec"] == body["spec"]
    assert "managedFields" in body["metadata"]  # the caller's body is left as it was


@pytest.mark.parametrize("status", [400, 422], ids=["bad request", "unprocessable"])
def test_pods_the_server_refuses_fail_the_job_with_its_message(status: int) -> None:
    message = 'Pod "bar-worker-0" is invalid: spec.volumes[0].name: Required value'

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        fake.answer("POST", "/pods$", status, message, times=2)
        await controller.reconcile(KEY)

    fake = run(scenario)
    (written,) = written_statuses(fake)
    assert written["phase"] == "Failed"
    failed = next(c for c in written["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == Reason.INVALID_SPEC
    assert failed["message"] == f"Invalid spec: {message}"
    assert event_reasons(fake) == [Reason.INVALID_SPEC]


def test_launcher_mpi_without_the_mpi_operator_waits_saying_what_to_install() -> None:
    """The MPIJob kind not served (yet): the job waits, Pending, saying so once, and is looked
    at again; once kopf watches the kind, the same job gets its MPIJob."""
    watched = [False]
    requeued: list[float] = []

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.watches_mpijobs = lambda: watched[0]
        controller.queue.add = lambda key, after=0.0: requeued.append(after)  # type: ignore[method-assign]
        start(fake, controller, job_body(launcher="mpi"))
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)
        assert not fake.made("POST", "/mpijobs")
        watched[0] = True  # the MPI Operator's CRD appeared: kopf watches it
        await controller.reconcile(KEY)

    fake = run(scenario)
    first = written_statuses(fake)[0]
    assert first["phase"] == "Pending"
    (created,) = [c for c in first["conditions"] if c["type"] == "Created"]
    assert (created["status"], created["reason"]) == ("False", "KindNotServed")
    assert created["message"] == MPI_OPERATOR_MISSING
    assert "the job waits until it does" in MPI_OPERATOR_MISSING
    assert event_reasons(fake).count(Reason.KIND_NOT_SERVED) == 1
    assert requeued and requeued[0] == 30.5
    assert len(fake.made("POST", "/mpijobs")) == 1
    assert fake.jobs[STATUS.removesuffix("/status")]["status"]["phase"] != "Failed"


def test_an_mpijob_the_server_does_not_serve_at_create_makes_the_job_wait() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body(launcher="mpi"))
        fake.answer("POST", "/mpijobs$", 404, "the server could not find the requested resource")
        await controller.reconcile(KEY)

    fake = run(scenario)
    (written,) = written_statuses(fake)
    assert written["phase"] == "Pending"
    assert written["conditions"][-1]["message"] == MPI_OPERATOR_MISSING


def test_what_exists_or_is_gone_already_is_success() -> None:
    """409 on create, 404 on a pod delete: a repeated reconcile goes on as if it had made them."""

    owned = {"ownerReferences": [{"kind": "DDPTrainingJob", "uid": UID, "controller": True}]}
    fake = FakeApi()
    fake.objects["/api/v1/namespaces/ns1/services/bar"] = {"metadata": {"name": "bar", **owned}}
    for index in (0, 1):
        path = f"{PODS}/bar-worker-{index}"
        fake.objects[path] = {"metadata": {"name": f"bar-worker-{index}", **owned}}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        fake.answer("POST", "/services$", 409, "already exists")
        fake.answer("POST", "/pods$", 409, "already exists")
        await controller.reconcile(KEY)
        fake.answer("DELETE", "/pods/", 404, "not found", times=2)
        restarting = {"phase": "Restarting", "restarts": 1, "startTime": "2026-11-22T12:00:00Z"}
        start(fake, controller, job_body(restarting, resource_version=20), [pod(0), pod(1)])
        await controller.reconcile(KEY)  # the old attempt's pods go: both already gone

    run(scenario, fake)
    assert [s["phase"] for s in written_statuses(fake)] == ["Pending", "Restarting"]
    assert len(fake.made("DELETE", PODS)) == 2


@pytest.mark.parametrize(
    ("holder", "phase", "reason"),
    [
        (
            {
                "ownerReferences": [
                    {
                        "kind": "DDPTrainingJob",
                        "name": "bar",
                        "uid": "uid-of-the-old-job",
                        "controller": True,
                    }
                ]
            },
            "Pending",
            "NameTaken",
        ),
        ({}, "Failed", "NameTaken"),
    ],
    ids=["an earlier job's, going: wait", "no owner: the user must free it"],
)
def test_a_childs_name_held_by_an_object_not_this_jobs_is_not_taken_for_it(
    holder: dict[str, Any], phase: str, reason: str
) -> None:
    """409 on a create, and the object of that name is not this job's: the job does not run
    without it (a NetworkPolicy, a worker), it waits where the holder goes by itself, and
    fails saying which object where only the user can free the name."""
    fake = FakeApi()
    path = "/apis/networking.k8s.io/v1/namespaces/ns1/networkpolicies/bar"
    fake.objects[path] = {"metadata": {"name": "bar", **holder}}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        fake.answer("POST", "/networkpolicies$", 409, "already exists")
        with contextlib.suppress(WaitingForRoomError):
            await controller.reconcile(KEY)

    run(scenario, fake)
    assert not fake.made("POST", PODS)
    (written,) = written_statuses(fake)
    assert written["phase"] == phase
    said = next(c for c in written["conditions"] if c["reason"] == reason)
    assert said["message"].startswith("NetworkPolicy bar exists and is not this job's")


def test_pods_of_a_node_that_stopped_reporting_are_force_deleted() -> None:
    """Past its deletion deadline and 30 s, a pod its kubelet never removed is deleted with
    grace period 0; a pod still within that time is deleted by no one (it is going)."""
    overdue = pod(0, deleting=True, deletion_deadline="2026-11-22T11:00:00Z")
    going = pod(1, deleting=True, deletion_deadline="2999-01-01T00:00:00Z")

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        restarting = {"phase": "Restarting", "restarts": 1, "startTime": "2026-11-22T10:00:00Z"}
        start(fake, controller, job_body(restarting), [overdue, going])
        await controller.reconcile(KEY)

    fake = run(scenario)
    deletes = fake.made("DELETE", PODS)
    assert [(c.path, c.body) for c in deletes] == [
        (f"{PODS}/bar-worker-0", {"gracePeriodSeconds": 0})
    ]


RUNNING = {"phase": "Running", "startTime": "2026-11-22T10:00:00Z"}
SAVED = {"exit_code": 86, "deleting": True, "reason": "EvictionByEvictionAPI"}


def test_a_worker_deleted_right_after_it_saved_is_a_preemption_not_a_vanished_one() -> None:
    """A drain's eviction: the kubelet removes the pod once it exited 86, and the reconcile
    may run after both events, the pod gone from the index."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.queue.add = lambda key, after=0.0: None  # type: ignore[method-assign]
        start(fake, controller, job_body(RUNNING), [pod(0)])
        controller.pod_deleted(KEY, pod(1, "Failed", **SAVED))
        controller.pod_deleted(KEY, pod(0, "Failed", exit_code=1))  # not a preempted one
        await controller.reconcile(KEY)

    fake = run(scenario)
    [status] = written_statuses(fake)
    # only the evicted worker is replaced; worker 0 runs on
    assert (status["phase"], status["restarts"], status["preemptions"]) == ("Starting", 0, 1)
    assert status["lastPreemption"]["reason"] == "EvictionByEvictionAPI"
    assert status["replacing"] == [1]


def test_a_worker_removed_while_it_ran_before_the_reconcile_is_a_preemption() -> None:
    """An eviction whose pod went at once (a short grace period, a node agent that answers
    at once; the soak's kwok): the reconcile runs after both events, the pod gone from the
    index. Its last look, being deleted while it ran, is what a reconcile in between would
    have seen: the worker is replaced alone, not counted (found by the soak, seed 12)."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.queue.add = lambda key, after=0.0: None  # type: ignore[method-assign]
        start(fake, controller, job_body(RUNNING), [pod(0)])
        controller.pod_deleted(KEY, pod(1, deleting=True, reason="EvictionByEvictionAPI"))
        await controller.reconcile(KEY)

    fake = run(scenario)
    [status] = written_statuses(fake)
    assert (status["restarts"], status["preemptions"]) == (0, 1), status.get("failure")
    assert status["lastPreemption"]["reason"] == "EvictionByEvictionAPI"
    assert status["replacing"] == [1]


def test_a_worker_of_a_lost_node_deleted_before_the_reconcile_names_the_node() -> None:
    """The taint manager evicts the pods of a node that stopped reporting, and the pod may be
    gone (something removed it: a node agent coming back, the pod garbage collector) before
    the reconcile sees it, its peer not evicted yet: its last look names the node, not a
    vanished pod."""
    lost = {
        "deleting": True,
        "reason": "DeletionByTaintManager",
        "unready_since": "2026-11-22T11:59:00Z",
        "node": "silent-node",
    }

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.queue.add = lambda key, after=0.0: None  # type: ignore[method-assign]
        start(fake, controller, job_body(RUNNING), [pod(1)])
        controller.pod_deleted(KEY, pod(0, **lost))
        await controller.reconcile(KEY)

    fake = run(scenario)
    [status] = written_statuses(fake)
    assert status["failure"]["reason"] == "NodeLost", status["failure"]
    assert status["failure"]["message"].startswith("node silent-node stopped reporting")


def test_after_last_words_the_job_is_looked_at_again_and_the_worker_replaced_once() -> None:
    """The last words stand for a pod already gone, once: the reconcile that used them
    creates the successor (under a name of its own: the words hold the first) and queues
    another at once (no event would come: worker 0 runs on unchanged), which creates no
    second one."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        queued: list[float] = []
        controller.queue.add = lambda key, after=0.0: queued.append(after)  # type: ignore[method-assign]
        start(fake, controller, job_body(RUNNING), [pod(0)])
        controller.pod_deleted(KEY, pod(1, "Failed", **SAVED))
        await controller.reconcile(KEY)
        assert queued == [0.0]
        await controller.reconcile(KEY)  # what the queue runs next

    fake = run(scenario)
    [created] = fake.made("POST", PODS)
    assert created.body["metadata"]["name"] == "bar-worker-1-r1"
    assert created.body["spec"]["hostname"] == "bar-worker-1"


def test_a_stopped_group_does_not_wait_for_the_last_words_of_its_pods() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        preempting = {
            **RUNNING,
            "phase": "Restarting",
            "preemptions": 1,
            "conditions": [{"type": "Restarting", "status": "True", "reason": "Preempted"}],
        }
        start(fake, controller, job_body(preempting), [])
        controller.pod_deleted(KEY, pod(1, "Failed", **SAVED))
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert len(fake.made("POST", PODS)) == 2


def test_the_operators_deletes_give_the_grace_the_last_save_needs() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        measured = {**RUNNING, "training": {"checkpoint": {"step": 5, "saveSeconds": 20.0}}}
        start(fake, controller, job_body(measured, runPolicy={"suspend": True}), [pod(0)])
        await controller.reconcile(KEY)

    fake = run(scenario)
    deletes = fake.made("DELETE", PODS)
    assert [(c.path, c.body) for c in deletes] == [
        (f"{PODS}/bar-worker-0", {"gracePeriodSeconds": 55})
    ]


def test_a_status_write_for_a_deleted_job_is_no_error() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body({"phase": "Starting"}), [pod(0), pod(1)])
        fake.jobs.clear()  # deleted meanwhile: the PATCH gets a 404
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert len(fake.made("PATCH", STATUS)) == 1


def test_a_401_reads_the_credentials_again_once() -> None:
    """Service-account tokens rotate: one 401 re-authenticates and repeats the call."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body({"phase": "Starting"}), [pod(0), pod(1)])
        fake.answer("PATCH", "/status$", 401, "Unauthorized")
        await controller.reconcile(KEY)

    fake = run(scenario, tokens=["old", "new"])
    patches = fake.made("PATCH", STATUS)
    assert [c.authorization for c in patches] == ["Bearer old", "Bearer new"]
    assert fake.made("POST", "/events")[0].authorization == "Bearer new"


def test_a_second_401_is_an_error() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body({"phase": "Starting"}), [pod(0), pod(1)])
        fake.answer("PATCH", "/status$", 401, "Unauthorized", times=2)
        with pytest.raises(UnauthorizedError):
            await controller.reconcile(KEY)

    fake = run(scenario, tokens=["old", "new"])
    assert len(fake.made("PATCH", STATUS)) == 2


def test_a_failed_reconcile_is_retried_with_a_growing_delay() -> None:
    retries: list[float] = []

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.queue.add = lambda key, after=0.0: retries.append(after)  # type: ignore[method-assign]
        start(fake, controller, job_body())
        fake.answer("POST", "/services$", 500, "etcdserver: request timed out", times=3)
        for _ in range(3):
            await controller.reconcile_or_retry(KEY)
        assert controller.failures[KEY] == 3
        await controller.reconcile_or_retry(KEY)  # the server answers again
        assert KEY not in controller.failures

    fake = run(scenario)
    assert retries == [retry_delay(1), retry_delay(2), retry_delay(3)]
    assert retry_delay(1) < retry_delay(2) < retry_delay(3)
    assert retry_delay(100) == 60.0
    assert len(fake.made("POST", PODS)) == 2  # created once the server answered


def test_an_unexpected_answer_is_raised_typed() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        fake.answer("POST", "/services$", 503, "overloaded")
        with pytest.raises(ApiError) as raised:
            await controller.reconcile(KEY)
        assert (raised.value.status, raised.value.message) == (503, "overloaded")

    run(scenario)


def test_a_deleted_job_is_forgotten() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        controller.failures[KEY] = 2
        controller.job_deleted(KEY, UID)
        await controller.reconcile(KEY)  # a reconcile still queued finds nothing to do
        assert KEY not in controller.failures

    fake = run(scenario)
    assert fake.calls == []


def test_pods_whose_create_failed_are_not_waited_for() -> None:
    """A pod the server did not create must not count as expected (Pending) until the
    expectation times out: the next reconcile creates it."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        fake.answer("POST", "/pods$", 500, "etcdserver: request timed out")
        with pytest.raises(ApiError):
            await controller.reconcile(KEY)
        created = [c.body["metadata"]["name"] for c in fake.made("POST", PODS)][1:]
        controller.pods = {KEY: [pod(int(n[-1]), "Pending") for n in created]}
        await controller.reconcile(KEY)

    fake = run(scenario)
    refused, *rest = [c.body["metadata"]["name"] for c in fake.made("POST", PODS)]
    assert len(rest) == 2 and rest[-1] == refused  # the refused pod, created by the retry


QUOTA_FULL = 'pods "bar-worker-0" is forbidden: exceeded quota: gpus, requested: requests.cpu=1'


def test_a_pod_refused_for_quota_takes_its_created_peer_with_it_and_waits() -> None:
    """worker-1 is created, worker-0 refused by a full quota: worker-1 is deleted (no half
    group holds its GPUs), the job says it waits; no event recreates the group before the
    backoff has passed, the retry after it does, with no restart counted."""
    retries: list[float] = []

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.queue.add = lambda key, after=0.0: retries.append(after)  # type: ignore[method-assign]
        start(fake, controller, job_body())
        fake.answer("POST", "/pods/?$", 403, QUOTA_FULL)  # the first pod create only
        await controller.reconcile_or_retry(KEY)
        await controller.reconcile_or_retry(KEY)  # an event of the deleted pod: held
        assert len(fake.made("POST", PODS)) == 2
        controller.held_until[KEY] = 0.0  # the backoff has passed
        await controller.reconcile_or_retry(KEY)
        assert KEY not in controller.failures

    fake = run(scenario)
    _, created, *again = [c.body["metadata"]["name"] for c in fake.made("POST", PODS)]
    assert [c.path.rsplit("/", 1)[-1] for c in fake.made("DELETE", PODS)] == [created]
    assert sorted(again) == ["bar-worker-0", "bar-worker-1"]
    waiting, recreated = written_statuses(fake)
    assert waiting["phase"] == "Pending"
    (condition,) = [c for c in waiting["conditions"] if c["type"] == "Created"]
    assert (condition["status"], condition["reason"]) == ("False", Reason.QUOTA_EXCEEDED)
    assert QUOTA_FULL in condition["message"]
    assert recreated.get("restarts", 0) == 0 and recreated["phase"] == "Pending"
    assert event_reasons(fake) == [Reason.QUOTA_EXCEEDED, Reason.WORKERS_CREATED]
    assert retries == [retry_delay(1)]


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (
            403,
            'pods "bar-worker-1" is forbidden: violates PodSecurity "baseline:latest": '
            "host namespaces (hostIPC=true)",
            Reason.POD_SECURITY_VIOLATION,
        ),
        (
            400,
            'admission webhook "deny.example.com" denied the request: no GPUs on Fridays',
            Reason.ADMISSION_DENIED,
        ),
    ],
    ids=["pod security", "webhook"],
)
def test_a_refusal_retrying_cannot_help_fails_the_job_and_leaves_no_pod(
    status: int, message: str, reason: Reason
) -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body())
        fake.answer("POST", "/pods/?$", status, message)
        await controller.reconcile_or_retry(KEY)
        assert KEY not in controller.failures  # done: nothing to retry

    fake = run(scenario)
    (written,) = written_statuses(fake)
    assert written["phase"] == "Failed"
    (failed,) = [c for c in written["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == reason and message in failed["message"]
    (created,) = [c.body["metadata"]["name"] for c in fake.made("POST", PODS)][1:]
    assert [c.path.rsplit("/", 1)[-1] for c in fake.made("DELETE", PODS)] == [created]
    assert event_reasons(fake) == [reason]


def forge(fake: FakeApi, controller: Controller, status: dict[str, Any]) -> None:
    """Someone other than the operator (a worker's token) merges `status` into the job's
    status, and the watch delivers the result."""
    job = fake.jobs[STATUS.removesuffix("/status")]
    job["status"] = {**job["status"], **status}
    job["metadata"]["resourceVersion"] = str(int(job["metadata"]["resourceVersion"]) + 1)
    controller.jobs.offer(KEY, copy.deepcopy(job))


def test_a_forged_status_is_restored_and_said_on_the_job() -> None:
    """A worker's token may write the whole status: what the operator owns (phase, restarts,
    replacing, attempt, ...) is restored from its own record, never acted on; the trainer's
    report written with it is kept."""
    running = {"phase": "Running", "startTime": "2026-11-22T12:00:00Z"}
    training = {"epoch": 2}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body(running), [pod(0), pod(1)])
        await controller.reconcile(KEY)
        forged = {"phase": "Succeeded", "restarts": 7, "replacing": list(range(2, 42))}
        forge(fake, controller, {**forged, "attempt": 3, "training": training})
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)  # said once: the restored status stands

    fake = run(scenario)
    assert not fake.made("POST", PODS)
    assert not fake.made("DELETE")
    stored = fake.jobs[STATUS.removesuffix("/status")]["status"]
    assert stored["phase"] == "Running"
    assert stored.get("restarts", 0) == 0
    assert stored.get("attempt", 0) == 0
    assert stored["replacing"] == []
    assert stored["training"] == training
    assert event_reasons(fake).count(Reason.STATUS_OVERWRITTEN) == 1
    (said,) = [
        c.body for c in fake.made("POST", "/events") if c.body["reason"] == "StatusOverwritten"
    ]
    assert said["type"] == "Warning"
    for field_name in ("status.phase", "status.restarts", "status.replacing", "status.attempt"):
        assert field_name in said["message"]
    assert "status.training" not in said["message"].split(":")[0]


def test_a_forged_replacing_list_makes_no_pod() -> None:
    """Alone, a forged status.replacing (indices past spec.nodes) creates nothing."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        running = {"phase": "Running", "startTime": "2026-11-22T12:00:00Z"}
        start(fake, controller, job_body(running), [pod(0), pod(1)])
        await controller.reconcile(KEY)
        forge(fake, controller, {"replacing": list(range(2, 42))})
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert not fake.made("POST", PODS)
    assert fake.jobs[STATUS.removesuffix("/status")]["status"]["replacing"] == []


def test_a_status_field_that_is_not_valid_is_ignored_said_once_and_the_job_goes_on() -> None:
    """A report with a time of no zone, or a count of the operator's out of range: the field
    is read as absent, one Warning names it, the operator's own is written again, and the
    reconcile does what it would have done (no error, no retry loop)."""
    training = {"epoch": 2, "updatedAt": "2026-11-22T12:00:00"}
    status = {"phase": "Starting", "restarts": -5, "training": training}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body(status), [pod(0), pod(1)])
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)

    fake = run(scenario)
    stored = fake.jobs[STATUS.removesuffix("/status")]["status"]
    assert (stored["phase"], stored["restarts"]) == ("Running", 0)
    assert stored["training"] == training  # a pod's report is the pods' to correct
    assert event_reasons(fake) == [Reason.STATUS_IGNORED, Reason.WORKERS_RUNNING]
    (said,) = [c.body for c in fake.made("POST", "/events") if c.body["reason"] == "StatusIgnored"]
    assert said["type"] == "Warning"
    assert "status.restarts: Input should be greater than or equal to 0" in said["message"]
    assert "status.training.updatedAt: a time needs a zone" in said["message"]


def test_a_reconcile_failing_again_and_again_says_so_on_the_job_once() -> None:
    """A Warning once, and the condition ReconcileFailing while it lasts; the operator's own
    write, never taken for someone else's."""
    conditions: list[dict[str, Any]] = []

    def failing_condition(fake: FakeApi) -> dict[str, Any]:
        stored = fake.jobs[STATUS.removesuffix("/status")]["status"]["conditions"]
        return next(c for c in stored if c["type"] == "ReconcileFailing")

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.queue.add = lambda key, after=0.0: None  # type: ignore[method-assign]
        start(fake, controller, job_body())
        fake.answer("POST", "/services$", 500, "etcdserver: request timed out\nmore", times=5)
        for _ in range(5):
            await controller.reconcile_or_retry(KEY)
        conditions.append(failing_condition(fake))
        await controller.reconcile_or_retry(KEY)  # the server answers again
        conditions.append(failing_condition(fake))
        await controller.reconcile_or_retry(KEY)

    fake = run(scenario)
    assert [(c["status"], c["reason"]) for c in conditions] == [
        ("True", "ReconcileFailing"),
        ("False", "Reconciled"),
    ]
    assert "etcdserver: request timed out" in conditions[0]["message"]
    assert Reason.STATUS_OVERWRITTEN not in event_reasons(fake)
    said = [c.body for c in fake.made("POST", "/events") if c.body["reason"] == "ReconcileFailing"]
    (failing,) = said
    assert failing["type"] == "Warning"
    assert failing["message"].startswith("reconciling this job failed 3 times in a row, the last")
    assert "etcdserver: request timed out" in failing["message"]
    assert "more" not in failing["message"]


def test_a_job_waiting_for_a_kind_asks_kopf_to_look_again_at_most_every_30_s() -> None:
    """kopf may miss a new CRD (its last event before discovery lists the kind): the job that
    waits for it has kopf look at the group again, and goes on when that finds the kind."""
    looked: list[str] = []
    served = [False]

    async def rediscover(group: str) -> None:
        looked.append(group)

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.watches_mpijobs = lambda: served[0]
        controller.rediscover = rediscover
        controller.queue.add = lambda key, after=0.0: None  # type: ignore[method-assign]
        start(fake, controller, job_body(launcher="mpi"))
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)  # within 30 s of the last look: not again
        assert looked == ["kubeflow.org"] and not fake.made("POST", "/mpijobs")
        controller.rediscovered_at["kubeflow.org"] -= 30

        async def finds_it(group: str) -> None:
            looked.append(group)
            served[0] = True

        controller.rediscover = finds_it
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert looked == ["kubeflow.org", "kubeflow.org"]
    assert len(fake.made("POST", "/mpijobs")) == 1
