"""The control plane is the real, version-stamped Kubernetes, with the fake nodes in place."""

from __future__ import annotations

import json

import kubernetes

from tests.cluster.support import Cluster, load_dev_cluster

KUBERNETES_VERSION = load_dev_cluster().KUBERNETES_VERSION


def test_server_and_kubectl_report_the_built_version(cluster: Cluster) -> None:
    server = kubernetes.client.VersionApi(cluster.api).get_code()
    assert server.git_version == KUBERNETES_VERSION
    client = json.loads(cluster.kubectl("version", "--output=json").stdout)
    assert client["clientVersion"]["gitVersion"] == KUBERNETES_VERSION
    assert client["serverVersion"]["gitVersion"] == KUBERNETES_VERSION


def test_fake_nodes_offer_accelerators(cluster: Cluster) -> None:
    nodes = cluster.core.list_node(label_selector="type=kwok").items
    by_accelerator: dict[str, list[dict[str, str]]] = {}
    for node in nodes:
        accelerator = node.metadata.labels["kubeddp.io/accelerator"]
        by_accelerator.setdefault(accelerator, []).append(node.status.allocatable)
    assert sorted((kind, len(found)) for kind, found in by_accelerator.items()) == [
        ("cpu", 1),
        ("gaudi", 2),
        ("nvidia", 2),
    ]
    assert all(a["nvidia.com/gpu"] == "8" for a in by_accelerator["nvidia"])
    assert all(
        a["habana.ai/gaudi"] == "8" and "hugepages-2Mi" in a for a in by_accelerator["gaudi"]
    )
    assert all("nvidia.com/gpu" not in a for a in by_accelerator["cpu"])
