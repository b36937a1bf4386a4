"""The control plane is the real, version-stamped Kubernetes, with the fake nodes in place."""

from __future__ import annotations

import json

import kubernetes

from tests.cluster.support import Cluster, load_dev_cluster

KUBERNETES_VERSION = load_dev_cluster().KUBERNETES_VERSION


def test_ports_handed_to_components_are_below_the_ephemeral_range() -> None:
    """Where outgoing connections never take them between the pick and the component's bind."""
    controlplane = load_dev_cluster().controlplane
    ephemeral_low = int(controlplane.EPHEMERAL_RANGE.read_text().split()[0])
    ports = {controlplane.free_port() for _ in range(20)}
    assert len(ports) > 1
    assert all(controlplane.LOWEST_PICKED_PORT <= port < ephemeral_low for port in ports), ports


def test_server_and_kubectl_report_the_built_version(cluster: Cluster) -> None:
    server = kubernetes.client.VersionApi(cluster.api).get_code()
    assert server.git_version == KUBERNETES_VERSION
    client = json.loads(cluster.kubectl("version", "--output=json").stdout)
    assert client["clientVersion"]["gitVersion"] == KUBERNETES_VERSION
    assert client["serverVersion"]["gitVersion"] == KUBERNETES_VERSION


def test_fake_nodes_offer_accelerators(cluster: Cluster) -> None:
    # By name: other tests may add fake nodes of their own for a while.
    expected = {
        "gpu-node-0": ("nvidia", "nvidia.com/gpu"),
        "gpu-node-1": ("nvidia", "nvidia.com/gpu"),
        "gaudi-node-0": ("gaudi", "habana.ai/gaudi"),
        "gaudi-node-1": ("gaudi", "habana.ai/gaudi"),
        "cpu-node-0": ("cpu", None),
    }
    for name, (accelerator, device) in expected.items():
        node = cluster.core.read_node(name)
        assert node.metadata.labels["kubeddp.io/accelerator"] == accelerator
        assert node.metadata.labels["type"] == "kwok"
        allocatable = node.status.allocatable
        assert allocatable["pods"] == "110"
        if device:
            assert allocatable[device] == "8"
        else:
            assert not {"nvidia.com/gpu", "habana.ai/gaudi"} & set(allocatable)
        if accelerator == "gaudi":
            assert allocatable["hugepages-2Mi"] == "96Gi"
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True"
