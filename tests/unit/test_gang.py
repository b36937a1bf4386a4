"""Gang scheduling's pure builders (kube_ddp.gang): each scheduler's PodGroup and how a worker
joins it; the status naming the gang."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kube_ddp import gang
from kube_ddp.api import JobStatus
from kube_ddp.controller import Controller, WaitingForRoomError
from kube_ddp.launchers import build_children
from kube_ddp.status import PodView, decide
from tests.unit.fake_api import FakeApi
from tests.unit.support import make_job, validate_strict
from tests.unit.test_controller import KEY, job_body, run, start, written_statuses

GPU = {"type": "nvidia", "perNode": 8}
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def children(**spec: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    objects = build_children(make_job(**spec))
    groups = [o for o in objects if o["kind"] == "PodGroup"]
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert objects.index(groups[0]) < objects.index(pods[0]) if groups else True
    return groups, pods


def test_no_gang_no_pod_group() -> None:
    groups, pods = children(nodes=2, accelerator=GPU)
    assert groups == []
    assert "schedulingGroup" not in pods[0]["spec"]
    assert "schedulerName" not in pods[0]["spec"]


def test_kubernetes_gang() -> None:
    (group,), pods = children(nodes=3, accelerator=GPU, scheduling={"gang": {}})
    assert group["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert group["metadata"]["name"] == "bar"
    assert group["metadata"]["namespace"] == "ns1"
    assert group["metadata"]["labels"]["kubeddp.io/job-name"] == "bar"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}}
    for pod in pods:
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "bar"}
        assert "schedulerName" not in pod["spec"]  # the default scheduler runs the plugin
        validate_strict(pod)


@pytest.mark.parametrize(
    ("gang_spec", "api_version", "spec", "member_of", "scheduler_name"),
    [
        (
            {"scheduler": "coscheduling", "scheduleTimeoutSeconds": 90},
            "scheduling.x-k8s.io/v1alpha1",
            {"minMember": 2, "scheduleTimeoutSeconds": 90},
            ("labels", "scheduling.x-k8s.io/pod-group"),
            "scheduler-plugins-scheduler",
        ),
        (
            {"scheduler": "volcano", "queue": "research"},
            "scheduling.volcano.sh/v1beta1",
            {"minMember": 2, "queue": "research"},
            ("annotations", "scheduling.k8s.io/group-name"),
            "volcano",
        ),
    ],
    ids=["coscheduling", "volcano"],
)
def test_second_scheduler_gangs(
    gang_spec: dict[str, Any],
    api_version: str,
    spec: dict[str, Any],
    member_of: tuple[str, str],
    scheduler_name: str,
) -> None:
    (group,), pods = children(nodes=2, accelerator=GPU, scheduling={"gang": gang_spec})
    assert (group["apiVersion"], group["kind"], group["spec"]) == (api_version, "PodGroup", spec)
    where, key = member_of
    for pod in pods:
        assert pod["metadata"][where][key] == "bar"
        assert pod["spec"]["schedulerName"] == scheduler_name
        assert "schedulingGroup" not in pod["spec"]
        validate_strict(pod)


def test_the_templates_scheduler_name_wins() -> None:
    _, pods = children(
        nodes=2,
        scheduling={"gang": {"scheduler": "volcano"}},
        template={"schedulerName": "volcano-gpu", "annotations": {"a": "b"}},
    )
    assert pods[0]["spec"]["schedulerName"] == "volcano-gpu"
    assert pods[0]["metadata"]["annotations"] == {"a": "b", "scheduling.k8s.io/group-name": "bar"}


def test_volcano_group_carries_the_priority_class() -> None:
    (group,), _ = children(
        nodes=2,
        scheduling={"gang": {"scheduler": "volcano"}},
        template={"priorityClassName": "high"},
    )
    assert group["spec"]["priorityClassName"] == "high"


@pytest.mark.parametrize(
    ("spec", "size"),
    [
        ({"nodes": 4}, 4),
        ({"nodes": 4, "scheduling": {"gang": {"minMember": 2}}}, 2),
        ({"nodes": 3, "nprocPerNode": 1, "elastic": {"minNodes": 2, "maxNodes": 4}}, 2),
    ],
    ids=["nodes", "minMember", "elastic minNodes"],
)
def test_gang_size(spec: dict[str, Any], size: int) -> None:
    spec = {"scheduling": {"gang": {}}, **spec}
    assert gang.min_member(make_job(**spec)) == size


def test_unschedulable_gang_is_named_in_status() -> None:
    job = make_job(nodes=3, accelerator=GPU, scheduling={"gang": {}})
    waiting = "pod group is unschedulable, waiting for minCount pods from a gang to be scheduled"
    pods = [
        PodView(
            name=f"bar-worker-{i}",
            index=i,
            attempt=0,
            phase="Pending",
            unschedulable=waiting,
            owner_uid=job.metadata.uid,
            owner_kind="DDPTrainingJob",
        )
        for i in range(3)
    ]
    running = job.model_copy(update={"status": JobStatus(phase="Pending")})
    decision = decide(running, pods, NOW)
    (condition,) = [c for c in decision.status.conditions if c.type == "Schedulable"]
    assert (condition.status, condition.reason) == ("False", "Unschedulable")
    assert condition.message == f"PodGroup bar (3 of 3 workers together): bar-worker-0: {waiting}"


def test_not_served_says_what_to_install() -> None:
    job = make_job(nodes=2, scheduling={"gang": {"scheduler": "volcano"}})
    assert gang.not_served(job).startswith(
        "scheduling.gang.scheduler volcano needs PodGroup scheduling.volcano.sh/v1beta1, which "
        "this cluster does not serve: it needs Volcano"
    )


def test_a_cluster_without_the_pod_group_kind_holds_the_job_saying_what_it_needs() -> None:
    """The named scheduler's PodGroup kind not served (not yet installed): no worker without
    its gang; the job waits, Pending, saying what to install, and tries again later."""
    kubernetes_gang = {"gang": {"scheduler": "kubernetes"}}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body(scheduling=kubernetes_gang))
        fake.answer("POST", "/podgroups$", 404, "the server could not find the requested resource")
        with pytest.raises(WaitingForRoomError):
            await controller.reconcile(KEY)

    fake = run(scenario)
    assert not fake.made("POST", "/pods")  # no worker without its gang
    (written,) = written_statuses(fake)
    assert written["phase"] == "Pending"
    created = next(c for c in written["conditions"] if c["type"] == "Created")
    said = gang.not_served(make_job(nodes=2, scheduling=kubernetes_gang))
    assert (created["status"], created["reason"], created["message"]) == (
        "False",
        "KindNotServed",
        said,
    )
    assert "the job waits until it is served" in said


@pytest.mark.parametrize(
    ("launcher", "served", "chosen"),
    [
        ("torchrun", {"kubernetes", "volcano", "coscheduling"}, "kubernetes"),
        ("torchrun", {"volcano", "coscheduling"}, "volcano"),
        ("torchrun", {"coscheduling"}, "coscheduling"),
        ("mpi", {"kubernetes", "volcano", "coscheduling"}, "volcano"),
        ("mpi", {"kubernetes", "coscheduling"}, "coscheduling"),
    ],
)
def test_a_gang_naming_no_scheduler_gets_the_first_the_cluster_serves(
    launcher: str, served: set[str], chosen: str
) -> None:
    job = make_job(nodes=2, launcher=launcher, scheduling={"gang": {}})
    resolved = gang.resolve(job, {gang.KINDS[s].api_version for s in served})
    assert not isinstance(resolved, str)
    assert resolved.spec.scheduling is not None and resolved.spec.scheduling.gang is not None
    assert resolved.spec.scheduling.gang.scheduler == chosen
    assert job.spec.scheduling is not None and job.spec.scheduling.gang is not None
    assert job.spec.scheduling.gang.scheduler is None  # the job itself is left as it is


def test_a_named_scheduler_is_kept_whatever_is_served() -> None:
    job = make_job(nodes=2, scheduling={"gang": {"scheduler": "coscheduling"}})
    assert gang.resolve(job, set()) is job


@pytest.mark.parametrize(("launcher", "tried"), [("torchrun", 3), ("mpi", 2)])
def test_a_gang_whose_candidates_none_is_served_says_each_and_what_to_do(
    launcher: str, tried: int
) -> None:
    job = make_job(nodes=2, launcher=launcher, scheduling={"gang": {}})
    said = gang.resolve(job, {"scheduling.k8s.io/v1alpha2"} if launcher == "mpi" else set())
    assert isinstance(said, str)
    assert said.count("(PodGroup ") == tried, said
    assert ("kubernetes (" in said) is (launcher == "torchrun")
    assert "install Volcano or scheduler-plugins' coscheduling" in said
    assert "or remove scheduling.gang" in said


def test_the_controller_asks_discovery_once_and_builds_the_served_gang() -> None:
    volcano = gang.KINDS["volcano"]

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        fake.objects[f"/apis/{volcano.api_version}"] = {"kind": "APIResourceList"}
        start(fake, controller, job_body(scheduling={"gang": {}}))
        await controller.reconcile(KEY)
        await controller.reconcile(KEY)

    fake = run(scenario)
    (group,) = fake.made("POST", "/podgroups")
    assert group.path.startswith(f"/apis/{volcano.api_version}/")
    pods = [c.body for c in fake.made("POST", "/pods")]
    assert pods and all(p["spec"]["schedulerName"] == "volcano" for p in pods)
    for kind in gang.KINDS.values():  # each asked once: the second reconcile used the answers
        assert len(fake.made("GET", f"/apis/{kind.api_version}")) == 1


def test_a_cluster_serving_no_gang_holds_a_job_naming_none() -> None:
    """No PodGroup kind served (a scheduler not installed yet): the job waits saying what to
    install; discovery is asked again on a later look."""

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body(scheduling={"gang": {}}))
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert not fake.made("POST", "/pods")
    (written,) = written_statuses(fake)
    assert written["phase"] == "Pending"
    said = gang.resolve(make_job(nodes=2, scheduling={"gang": {}}), set())
    assert isinstance(said, str) and "the job waits until one is" in said
    assert written["conditions"][-1]["message"] == said


@pytest.mark.parametrize(
    ("gang_spec", "member_of"),
    [
        ({"scheduler": "coscheduling"}, ("labels", "scheduling.x-k8s.io/pod-group")),
        ({"scheduler": "volcano"}, ("annotations", "scheduling.k8s.io/group-name")),
    ],
    ids=["coscheduling", "volcano"],
)
def test_mpi_gang_holds_the_launcher_and_the_workers(
    gang_spec: dict[str, Any], member_of: tuple[str, str]
) -> None:
    job = make_job(nodes=3, launcher="mpi", accelerator=GPU, scheduling={"gang": gang_spec})
    objects = build_children(job)
    kinds = [o["kind"] for o in objects]
    assert kinds.index("PodGroup") < kinds.index("MPIJob")  # the group exists before its pods
    (group,) = [o for o in objects if o["kind"] == "PodGroup"]
    (mpijob,) = [o for o in objects if o["kind"] == "MPIJob"]
    assert group["spec"]["minMember"] == 4  # 3 workers and the launcher
    # the launcher is created with the workers: the gang binds none of them without it
    assert mpijob["spec"]["launcherCreationPolicy"] == "AtStartup"
    where, key = member_of
    for replica in ("Launcher", "Worker"):
        template = mpijob["spec"]["mpiReplicaSpecs"][replica]["template"]
        assert template["metadata"][where][key] == "bar"
        assert (
            template["spec"]["schedulerName"] == gang.KINDS[gang_spec["scheduler"]].scheduler_name
        )
    assert gang.describe(job) == "PodGroup bar (the launcher and 3 of 3 workers together)"


def test_mpi_without_a_gang_waits_for_its_workers_before_the_launcher() -> None:
    (mpijob,) = [
        o for o in build_children(make_job(nodes=2, launcher="mpi")) if o["kind"] == "MPIJob"
    ]
    assert mpijob["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert [
        o for o in build_children(make_job(nodes=2, launcher="mpi")) if o["kind"] == "PodGroup"
    ] == []
