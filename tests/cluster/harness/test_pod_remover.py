"""The kubelet's last step for kwok's nodes (`devcluster.pod_remover`): a deleted pod is removed
by its uid, never a newer pod of its name; a stopped kubelet's pods stay Terminating."""

from __future__ import annotations

import time
from typing import Any

from tests.cluster.harness.test_kwok_nodes import wait_for_phase
from tests.cluster.support import Cluster, load_dev_cluster, pod_manifest, wait_for

dev_cluster = load_dev_cluster()
pod_remover = dev_cluster.pod_remover


def gone(core: Any, namespace: str, name: str) -> bool:
    return name not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items}


def test_a_stale_deletion_never_reaches_the_next_pod_of_its_name(
    cluster: Cluster, namespace: str
) -> None:
    """What kwok's own pod-delete stage did (by name, a play left over from the pod before):
    the remover offered the first pod as it was while being deleted, once its name is a new
    pod's, leaves the new one running."""
    core = cluster.core
    core.create_namespaced_pod(namespace, pod_manifest("worker"))
    first = wait_for_phase(core, namespace, "worker", "Running")
    core.delete_namespaced_pod("worker", namespace)
    wait_for(lambda: gone(core, namespace, "worker"), "the first worker removed", timeout=10)
    core.create_namespaced_pod(namespace, pod_manifest("worker"))
    second = wait_for_phase(core, namespace, "worker", "Running")

    stale = cluster.api.sanitize_for_serialization(first)
    stale["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state = dev_cluster.read_state()
    remover = pod_remover.Remover(pod_remover.Api(state["server"], dev_cluster.paths.PKI))
    remover.offer(stale)

    assert first.metadata.uid in remover.removed  # answered 409: not its pod any more
    now = core.read_namespaced_pod("worker", namespace)
    assert (now.metadata.uid, now.metadata.deletion_timestamp) == (second.metadata.uid, None)


def test_a_stopped_kubelets_pod_stays_terminating_until_it_is_back(
    cluster: Cluster, namespace: str
) -> None:
    core = cluster.core
    core.create_namespaced_pod(
        namespace, pod_manifest("worker", annotations=pod_remover.KUBELET_STOPPED)
    )
    wait_for(
        lambda: core.read_namespaced_pod("worker", namespace).spec.node_name,
        "worker scheduled",
    )
    core.delete_namespaced_pod("worker", namespace)
    time.sleep(3)  # what the remover takes for a pod it removes is well under a second
    assert core.read_namespaced_pod("worker", namespace).metadata.deletion_timestamp

    back = {"metadata": {"annotations": dict.fromkeys(pod_remover.KUBELET_STOPPED)}}
    core.patch_namespaced_pod("worker", namespace, back)
    wait_for(lambda: gone(core, namespace, "worker"), "worker removed", timeout=10)
