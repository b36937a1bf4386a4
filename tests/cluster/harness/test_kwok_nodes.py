"""Scheduling against the fake nodes, and the pod lifecycle the kwok stages simulate."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from tests.cluster.support import Cluster, pod_manifest, wait_for

EXIT_CODE = "sim.kubeddp.io/exit-code"


def wait_for_phase(core: Any, namespace: str, name: str, phase: str) -> Any:
    def in_phase() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == phase else None

    return wait_for(in_phase, f"pod {name} to be {phase}", timeout=30)


def node_accelerator(core: Any, node_name: str) -> str:
    return str(core.read_node(node_name).metadata.labels["kubeddp.io/accelerator"])


def test_gpu_pod_lands_on_a_gpu_node_and_runs(cluster: Cluster, namespace: str) -> None:
    core = cluster.core
    core.create_namespaced_pod(namespace, pod_manifest("gpu", limits={"nvidia.com/gpu": "8"}))
    pod = wait_for_phase(core, namespace, "gpu", "Running")
    assert node_accelerator(core, pod.spec.node_name) == "nvidia"
    assert pod.status.container_statuses[0].ready
    assert pod.status.container_statuses[0].state.running is not None


def test_pod_asking_more_gpus_than_a_node_has_stays_unschedulable(
    cluster: Cluster, namespace: str
) -> None:
    core = cluster.core
    core.create_namespaced_pod(namespace, pod_manifest("too-big", limits={"nvidia.com/gpu": "9"}))

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("too-big", namespace)
        conditions = {c.type: c for c in pod.status.conditions or []}
        scheduled = conditions.get("PodScheduled")
        return pod if scheduled and scheduled.status == "False" else None

    pod = wait_for(unschedulable, "PodScheduled=False on too-big")
    condition = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert condition.reason == "Unschedulable"
    assert "nvidia.com/gpu" in condition.message
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_gaudi_pod_lands_on_a_gaudi_node(cluster: Cluster, namespace: str) -> None:
    core = cluster.core
    # What the operator asks for a Gaudi worker: all 8 cards, hugepages, and memory with them.
    limits = {"habana.ai/gaudi": "8", "hugepages-2Mi": "95000Mi", "memory": "64Gi", "cpu": "16"}
    core.create_namespaced_pod(namespace, pod_manifest("gaudi", limits=limits))
    pod = wait_for_phase(core, namespace, "gaudi", "Running")
    assert node_accelerator(core, pod.spec.node_name) == "gaudi"


@pytest.mark.parametrize(
    ("exit_code", "phase", "reason"), [("137", "Failed", "Error"), ("0", "Succeeded", "Completed")]
)
def test_exit_code_annotation_ends_a_running_pod(
    cluster: Cluster, namespace: str, exit_code: str, phase: str, reason: str
) -> None:
    core = cluster.core
    core.create_namespaced_pod(namespace, pod_manifest("worker"))
    wait_for_phase(core, namespace, "worker", "Running")
    # Tests mark a pod that already runs, as a training process would end later on.
    core.patch_namespaced_pod(
        "worker", namespace, {"metadata": {"annotations": {EXIT_CODE: exit_code}}}
    )
    pod = wait_for_phase(core, namespace, "worker", phase)
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == int(exit_code)
    assert terminated.reason == reason
    assert not pod.status.container_statuses[0].ready


def test_exit_code_annotation_set_at_creation(cluster: Cluster, namespace: str) -> None:
    core = cluster.core
    core.create_namespaced_pod(namespace, pod_manifest("crash", annotations={EXIT_CODE: "3"}))
    pod = wait_for_phase(core, namespace, "crash", "Failed")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3


def test_deleted_pod_goes_away_promptly(cluster: Cluster, namespace: str) -> None:
    core = cluster.core
    core.create_namespaced_pod(namespace, pod_manifest("doomed"))
    wait_for_phase(core, namespace, "doomed", "Running")
    core.delete_namespaced_pod("doomed", namespace)  # default grace period: 30 s

    def vanished() -> bool:
        return all(p.metadata.name != "doomed" for p in core.list_namespaced_pod(namespace).items)

    wait_for(vanished, "the deleted pod to vanish", timeout=10)


def test_pod_owned_by_a_deleted_object_is_garbage_collected(
    cluster: Cluster, namespace: str
) -> None:
    core = cluster.core
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
    }
    core.create_namespaced_pod(namespace, pod_manifest("owned", owner=reference))
    wait_for_phase(core, namespace, "owned", "Running")
    core.delete_namespaced_config_map("owner", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("owned", namespace)
        except kubernetes.client.ApiException as error:
            return bool(error.status == 404)
        return False

    wait_for(gone, "the garbage collector to delete the owned pod", timeout=30)
