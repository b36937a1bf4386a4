"""spec.scheduling.topology under real Kueue TAS (v0.19.2, hack/devcluster/kueue.py), with the
Topology, ResourceFlavor and queues of manifests/examples/kueue/topology.yaml, on five kwok
nodes of 8 GPUs labelled by block and rack: block a holds racks a1 and a2 of two nodes each,
block b rack b1 of one. Kueue picks the domain; its topology ungater writes each gated
worker's node into its nodeSelector; kube-scheduler binds it there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_ddp import kueue
from tests.cluster.operator_support import Jobs, OperatorProcess
from tests.cluster.support import Cluster, wait_for
from tests.cluster.test_kueue import (
    kueue_running,  # noqa: F401 (a fixture here too)
    queued_job,
    wait_suspended,
    workload_of,
)

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "manifests" / "examples" / "kueue" / "topology.yaml"
LOCAL_QUEUE = "racked-queue"
BLOCK, RACK = "topology.kubeddp.io/block", "topology.kubeddp.io/rack"
RACKS = {"a1": "a", "a2": "a", "b1": "b"}
NODES = {
    f"rack-{rack}-{i}": rack
    for rack, size in (("a1", 2), ("a2", 2), ("b1", 1))
    for i in range(size)
}


def racked_node(name: str, rack: str) -> dict[str, Any]:
    """A kwok node with 8 GPUs in `rack` (hack/nodes.yaml's GPU nodes, without their
    accelerator label, so the other tests' flavor never picks it)."""
    capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubeddp.io/pool": "racked",
        BLOCK: RACKS[rack],
        RACK: rack,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


@pytest.fixture(scope="module")
def racked(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[None]:
    """Kueue, the racked nodes and the example's cluster-scoped objects, removed afterwards."""
    request.getfixturevalue("kueue_running")
    for name, rack in NODES.items():
        cluster.core.create_node(racked_node(name, rack))
    try:
        cluster.kubectl("apply", f"--filename={TOPOLOGY}", "--namespace=default")
        cluster.kubectl("delete", "localqueue", LOCAL_QUEUE, "--namespace=default")
        yield
    finally:
        cluster.kubectl("delete", f"--filename={TOPOLOGY}", "--ignore-not-found", "--wait=false")
        for name in NODES:
            cluster.core.delete_node(name)


@pytest.fixture
def queue(racked: None, cluster: Cluster, namespace: str) -> str:
    """The example's LocalQueue in the test's namespace, once the racked nodes are empty: an
    earlier test's pods, still going, would leave Kueue less room than the test counts on."""

    def empty() -> bool:
        pods = cluster.core.list_pod_for_all_namespaces(label_selector=kueue.POD_SET_LABEL)
        return not any(p.spec.node_name in NODES for p in pods.items)

    wait_for(empty, "no pod on the racked nodes", timeout=60)
    cluster.kubectl("apply", f"--filename={TOPOLOGY}", f"--namespace={namespace}")
    return LOCAL_QUEUE


def topology_job(name: str, queue: str, nodes: int, mode: str) -> dict[str, Any]:
    manifest = queued_job(name, queue, scheduling={"topology": {"level": RACK, "mode": mode}})
    manifest["spec"]["nodes"] = nodes
    return manifest


def racks_of(jobs: Jobs, name: str, count: int, attempt: int = 0) -> list[str]:
    """The racks of the nodes the job's workers run on, once all `count` run, each where Kueue
    put it: its ungater removed the gate and named the node in the nodeSelector."""
    pods = jobs.wait_pods(name, count, attempt=attempt, timeout=60)
    for pod in pods:
        assert not pod.spec.scheduling_gates
        assert pod.spec.node_selector.get("kubernetes.io/hostname") == pod.spec.node_name
        assert pod.spec.node_selector["kubeddp.io/pool"] == "racked"  # the flavor's
    return [NODES[p.spec.node_name] for p in pods]


def test_a_job_that_fits_a_rack_runs_in_one(
    queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(topology_job("in-rack", queue, 2, "Required"))
    racks = racks_of(jobs, "in-rack", 2)
    assert len(set(racks)) == 1 and racks[0] in ("a1", "a2")
    (assignment,) = workload_of(jobs, "in-rack")["status"]["admission"]["podSetAssignments"]
    # Each worker gets a node: Kueue assigns at the lowest level, the hostname.
    assert assignment["topologyAssignment"]["levels"] == ["kubernetes.io/hostname"]
    jobs.wait_phase("in-rack", "Running")
    # A group restart's workers are gated again and placed in the admission's domains.
    jobs.end_worker("in-rack-worker-1", 137)
    assert racks_of(jobs, "in-rack", 2, attempt=1) == racks
    assert jobs.wait_phase("in-rack", "Running")["restarts"] == 1


def test_a_job_that_fits_no_rack_waits_saying_why(
    queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(topology_job("too-wide", queue, 3, "Required"))  # no rack has 3 nodes
    waiting = wait_suspended(jobs, "too-wide", "Queued")
    assert waiting["message"].startswith(f"Queued in LocalQueue {queue}: ")
    assert 'topology "racks" allows to fit only 2 out of 3 pod(s)' in waiting["message"]
    assert jobs.pods("too-wide") == []
    assert jobs.get("too-wide")["spec"]["runPolicy"]["suspend"] is True


def test_preferred_takes_one_block_when_no_rack_fits(
    queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(topology_job("spread", queue, 3, "Preferred"))
    racks = racks_of(jobs, "spread", 3)
    assert {RACKS[r] for r in racks} == {"a"}  # one block, two racks: the next level up
    assert len(set(racks)) == 2
    jobs.wait_phase("spread", "Running")
    wait_for(lambda: kueue.is_admitted(workload_of(jobs, "spread")), "spread admitted", 5)


def test_a_job_without_a_topology_is_still_placed_by_kueue(
    queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    """The flavor names a Topology, so Kueue assigns nodes to a job that asked for none (its
    implicit TAS): the workers wait at the gate for them like any other TAS pods."""
    jobs.create(queued_job("unasked", queue))
    assert len(racks_of(jobs, "unasked", 2)) == 2
    annotations = jobs.get("unasked")["spec"]["template"]["annotations"]
    assert annotations == {kueue.UNCONSTRAINED_ANNOTATION: "true"}
    jobs.wait_phase("unasked", "Running")
