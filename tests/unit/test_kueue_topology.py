"""Topology-aware placement through Kueue's TAS (kube_ddp.kueue): the pod set's topology
request, what the workers carry for Kueue's topology ungater, and the refusal of a job that
asks for a topology without a queue (render and the operator alike)."""

from __future__ import annotations

from typing import Any

import pytest

from kube_ddp import kueue, names
from kube_ddp.builders import build_children
from kube_ddp.controller import Controller
from tests.unit.fake_api import FakeApi
from tests.unit.test_cli import BAR, render
from tests.unit.test_controller import KEY, job_body, run, start, written_statuses
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
