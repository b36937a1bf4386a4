"""Topology-aware placement through Kueue's TAS (kube_ddp.kueue): the pod set's topology
request, what the workers (with launcher mpi, the MPIJob's templates) carry for Kueue's
topology ungater, and the refusal of a job that asks for a topology without a queue (render
and the operator alike)."""

from __future__ import annotations

from typing import Any

import pytest

from kube_ddp import kueue, names
from kube_ddp.api import load_job
from kube_ddp.controller import Controller
from kube_ddp.kube import workload_path
from kube_ddp.launchers import build_children
from kube_ddp.launchers.mpi import LAUNCHER_REQUESTS
from kube_ddp.status.views import MPIJobView
from tests.unit.fake_api import FakeApi
from tests.unit.test_cli import BAR, render
from tests.unit.test_controller import KEY, UID, job_body, run, start, written_statuses
from tests.unit.test_kueue import (
    ADMISSION,
    ADMITTED,
    NOW,
    NVIDIA_FLAVOR,
    queued_body,
    queued_job,
    reconcile_admitted,
    with_status,
    workload_for,
)

RACK = "topology.kubeddp.io/rack"
GPUS = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}}


def with_topology(mode: str | None = None) -> dict[str, Any]:
    topology = {"level": RACK} | ({"mode": mode} if mode else {})
    return {**GPUS, "scheduling": {"topology": topology}}


@pytest.mark.parametrize(
    ("mode", "field", "annotation"),
    [
        (None, "required", "kueue.x-k8s.io/podset-required-topology"),
        ("Preferred", "preferred", "kueue.x-k8s.io/podset-preferred-topology"),
    ],
)
def test_the_pod_set_asks_kueue_for_the_level(
    mode: str | None, field: str, annotation: str
) -> None:
    (pod_set,) = workload_for(queued_job(with_topology(mode)))["spec"]["podSets"]
    assert pod_set["topologyRequest"] == {field: RACK, "podIndexLabel": names.LABEL_REPLICA_INDEX}
    assert pod_set["template"]["metadata"]["annotations"] == {annotation: RACK}
    assert "schedulingGates" not in pod_set["template"]["spec"]  # the pods', not the pod set's


def test_without_topology_the_pod_set_asks_nothing() -> None:
    (pod_set,) = workload_for(queued_job(GPUS))["spec"]["podSets"]
    assert "topologyRequest" not in pod_set
    assert "annotations" not in pod_set["template"]["metadata"]


def test_workers_wait_at_the_gate_for_kueues_domain() -> None:
    job = queued_job(with_topology())
    pods = [o for o in build_children(job) if o["kind"] == "Pod"]
    assert len(pods) == 2
    for index, pod in enumerate(pods):
        assert pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == kueue.POD_SET
        assert pod["metadata"]["labels"][names.LABEL_REPLICA_INDEX] == str(index)
        annotations = pod["metadata"]["annotations"]
        assert annotations["kueue.x-k8s.io/workload"] == kueue.workload_name(job)
        assert annotations["kueue.x-k8s.io/podset-required-topology"] == RACK


def test_workers_without_topology_are_not_gated() -> None:
    pods = [o for o in build_children(queued_job(GPUS)) if o["kind"] == "Pod"]
    assert all("schedulingGates" not in p["spec"] for p in pods)
    assert all("kueue.x-k8s.io/podset" not in p["metadata"]["labels"] for p in pods)


def test_an_admitted_job_creates_gated_workers_with_the_flavors_selectors() -> None:
    fake = reconcile_admitted(queued_body(**with_topology(), runPolicy={"suspend": True}))
    pods = [c.body for c in fake.made("POST", "/pods")]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["schedulingGates"] == [{"name": kueue.TOPOLOGY_GATE}]
        assert pod["spec"]["nodeSelector"] == {"kubeddp.io/accelerator": "nvidia"}


def test_the_operator_fails_a_topology_without_a_queue_creating_nothing() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, job_body(**with_topology()))
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert not fake.made("POST", "/pods") and not fake.made("POST", "/workloads")
    (written,) = written_statuses(fake)
    assert written["phase"] == "Failed"
    assert written["conditions"][0]["message"] == f"Invalid spec: {kueue.TOPOLOGY_NOT_QUEUED}"


def test_render_refuses_a_topology_without_a_queue(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    unqueued = BAR + f"  scheduling: {{topology: {{level: {RACK}}}}}\n"
    code, objects, err = render(capsys, write_job(unqueued))
    assert (code, objects) == (2, [])
    assert f"spec.scheduling.topology needs the label {kueue.QUEUE_LABEL}" in err
    queued = unqueued.replace(
        "  name: bar\n", "  name: bar\n  labels: {kueue.x-k8s.io/queue-name: lq}\n"
    )
    code, objects, _ = render(capsys, write_job(queued))
    assert code == 0 and any(o["kind"] == "Pod" and o["spec"]["schedulingGates"] for o in objects)


TAS_ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {
            "name": "worker",
            "count": 2,
            "flavors": {"nvidia.com/gpu": "racked"},
            "topologyAssignment": {"levels": ["kubernetes.io/hostname"], "slices": []},
        }
    ],
}


def test_a_job_kueue_placed_by_topology_unasked_is_marked_and_gated() -> None:
    """Kueue's implicit TAS: a flavor with a topologyName places a pod set that asked for none;
    the admission marks the template as Kueue marks its own jobs', and the workers are gated."""
    job = queued_job({**GPUS, "runPolicy": {"suspend": True}})
    admitted = with_status(workload_for(job), admission=TAS_ADMISSION, conditions=ADMITTED)
    step = kueue.plan(job, admitted, {"racked": {"spec": {}}}, False, NOW)
    template = step.job_patch["spec"]["template"]
    assert template["annotations"] == {kueue.UNCONSTRAINED_ANNOTATION: "true"}
    marked = queued_job({**GPUS, "template": {"annotations": template["annotations"]}})
    pods = [o for o in build_children(marked) if o["kind"] == "Pod"]
    assert all(p["spec"]["schedulingGates"] == [{"name": kueue.TOPOLOGY_GATE}] for p in pods)
    # Readmitted to a flavor without a topology: the mark goes.
    suspended = queued_job({**GPUS, "runPolicy": {"suspend": True}, "template": template})
    again = with_status(workload_for(suspended), admission=ADMISSION, conditions=ADMITTED)
    step = kueue.plan(suspended, again, {"nvidia": NVIDIA_FLAVOR}, False, NOW)
    assert step.job_patch["spec"]["template"]["annotations"] == {
        kueue.UNCONSTRAINED_ANNOTATION: None
    }


def test_a_job_that_asked_for_a_topology_is_not_marked_unconstrained() -> None:
    job = queued_job({**with_topology(), "runPolicy": {"suspend": True}})
    admitted = with_status(workload_for(job), admission=TAS_ADMISSION, conditions=ADMITTED)
    step = kueue.plan(job, admitted, {"racked": {"spec": {}}}, False, NOW)
    assert "annotations" not in step.job_patch["spec"]["template"]


# --- launcher mpi: the workers in one domain, the launcher on any node of the flavor --------

MPI_TOPOLOGY = {**with_topology(), "launcher": "mpi"}


def mpijob_templates(job: Any) -> dict[str, Any]:
    (mpijob,) = [c for c in build_children(job) if c["kind"] == names.MPIJOB_KIND]
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    return {kueue.LAUNCHER_POD_SET: replicas["Launcher"], kueue.POD_SET: replicas["Worker"]}


def test_an_mpi_workload_asks_a_domain_for_the_workers_and_none_for_the_launcher() -> None:
    launcher, worker = workload_for(queued_job(MPI_TOPOLOGY))["spec"]["podSets"]
    # The MPI Operator numbers its workers with its own label.
    assert worker["topologyRequest"] == {
        "required": RACK,
        "podIndexLabel": names.MPI_LABEL_REPLICA_INDEX,
    }
    assert launcher["topologyRequest"] == {"unconstrained": True}
    assert launcher["template"]["metadata"]["annotations"] == {
        kueue.UNCONSTRAINED_ANNOTATION: "true"
    }
    # A pod set that requests nothing gets no flavor, and in a TAS queue is never admitted.
    requests = launcher["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == LAUNCHER_REQUESTS
    assert all("schedulingGates" not in p["template"]["spec"] for p in (launcher, worker))


def test_the_mpi_operators_pods_wait_at_the_gate_for_kueues_domain() -> None:
    job = queued_job(MPI_TOPOLOGY)
    templates = mpijob_templates(job)
    for pod_set, annotation in (
        (kueue.LAUNCHER_POD_SET, {kueue.UNCONSTRAINED_ANNOTATION: "true"}),
        (kueue.POD_SET, {"kueue.x-k8s.io/podset-required-topology": RACK}),
    ):
        template = templates[pod_set]["template"]
        assert template["spec"]["schedulingGates"] == [{"name": kueue.TOPOLOGY_GATE}]
        assert template["metadata"]["labels"][kueue.POD_SET_LABEL] == pod_set
        assert template["metadata"]["annotations"] == {
            kueue.WORKLOAD_ANNOTATION: kueue.workload_name(job),
            **annotation,
        }


def test_mpi_templates_without_topology_are_not_gated() -> None:
    templates = mpijob_templates(queued_job({**GPUS, "launcher": "mpi"}))
    for replica in templates.values():
        assert "schedulingGates" not in replica["template"]["spec"]
        assert kueue.POD_SET_LABEL not in replica["template"]["metadata"]["labels"]


MPI_TAS_ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {**TAS_ADMISSION["podSetAssignments"][0], "name": "launcher", "count": 1},
        *TAS_ADMISSION["podSetAssignments"],
    ],
}


def test_an_mpi_job_kueue_placed_by_topology_unasked_resumes_gated() -> None:
    """Kueue's implicit TAS for both pod sets: the MPIJob, created before the admission, is
    resumed with both templates marked and gated."""
    body = queued_body(**GPUS, launcher="mpi", runPolicy={"suspend": True})
    body["status"] = {"phase": "Suspended"}
    job = load_job(body)
    fake = FakeApi()
    fake.objects[workload_path("ns1", kueue.workload_name(job))] = with_status(
        workload_for(job), admission=MPI_TAS_ADMISSION, conditions=ADMITTED
    )
    fake.objects[kueue.flavor_path("racked")] = {"spec": {}}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, body)
        controller.mpijobs[KEY] = MPIJobView(name="bar", attempt=0, suspended=True, owner_uid=UID)
        await controller.reconcile(KEY)  # the admission written on the job, the MPIJob resumed

    run(scenario, fake)
    (resume,) = fake.made("PATCH", "/mpijobs/")
    ops = {op["path"]: op["value"] for op in resume.body}
    assert ops["/spec/runPolicy/suspend"] is False
    for replica, pod_set in (("Launcher", kueue.LAUNCHER_POD_SET), ("Worker", kueue.POD_SET)):
        template = f"/spec/mpiReplicaSpecs/{replica}/template"
        assert ops[f"{template}/spec/schedulingGates"] == [{"name": kueue.TOPOLOGY_GATE}]
        metadata = ops[f"{template}/metadata"]
        assert metadata["labels"][kueue.POD_SET_LABEL] == pod_set
        assert metadata["annotations"][kueue.UNCONSTRAINED_ANNOTATION] == "true"
