"""The operator's own API client (`kube_ddp.kube.Kube`) against the real API server, where
what the server does matters: a delete that must not reach a pod's successor, a body streamed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kube_ddp.kube import Kube
from tests.cluster.support import Cluster, wait_for

# Never scheduled (no node has this label): a pod without a node is deleted at once.
UNPLACED: dict[str, Any] = {
    "nodeSelector": {"kubeddp.io/test-nowhere": "true"},
    "containers": [{"name": "main", "image": "example.invalid/none"}],
}


def test_a_pod_deleted_by_uid_spares_its_successor(
    cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replacement takes its predecessor's name: a delete of the predecessor that arrives
    late must leave the replacement alone."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    core = cluster.core
    manifest = {"metadata": {"name": "worker-1"}, "spec": UNPLACED}

    def exists() -> Any:
        return core.list_namespaced_pod(namespace, field_selector="metadata.name=worker-1").items

    lost = core.create_namespaced_pod(namespace, manifest).metadata.uid
    core.delete_namespaced_pod("worker-1", namespace)
    wait_for(lambda: not exists(), "worker-1 gone", timeout=30)
    successor = core.create_namespaced_pod(namespace, manifest).metadata.uid

    async def scenario() -> None:
        kube = Kube()
        try:
            await kube.delete_pod(namespace, "worker-1", uid=lost)  # 409 inside: left alone
            assert [p.metadata.uid for p in exists()] == [successor]
            await kube.delete_pod(namespace, "worker-1", uid=successor)
            await kube.delete_pod(namespace, "worker-1", uid=successor)  # 404 inside: done
        finally:
            await kube.close()

    asyncio.run(scenario())
    wait_for(lambda: not exists(), "worker-1 deleted by its uid", timeout=30)


def test_a_streamed_body_comes_line_by_line(
    cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Kube.lines`, which follows a pod's log for the Python client, on the server's other
    stream: a watch, one JSON event a line, ended by the server after timeoutSeconds."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    for name in ("a", "b"):
        cluster.core.create_namespaced_pod(
            namespace, {"metadata": {"name": name}, "spec": UNPLACED}
        )

    async def read() -> list[str]:
        kube = Kube()
        try:
            path = f"/api/v1/namespaces/{namespace}/pods?watch=true&timeoutSeconds=2"
            return [line async for line in kube.lines(path)]
        finally:
            await kube.close()

    events = [json.loads(line) for line in asyncio.run(read())]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]
