"""kube-ddp under real Kueue (sigs.k8s.io/kueue v0.19.2, built from its module and run out of
cluster by hack/devcluster/kueue.py), with the queues of manifests/examples/kueue/queues.yaml:
quota, waiting, preemption, and jobs that name no queue.

Also topology-aware placement through Kueue's TAS, on kwok nodes labelled by block and rack.

kwok's pods run nothing: "resumes from its checkpoint" is checked as what the operator owes the
trainer (the same attempt, no restart counted, the group recreated); the trainer's resume
from `checkpointDir` is the trainer tier's (tests/trainer).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_ddp import kueue, names
from kube_ddp.api import load_job
from tests.cluster.conftest import IN_CI
from tests.cluster.operator_support import Jobs, OperatorProcess, env_of, job_manifest
from tests.cluster.support import Cluster, load_dev_cluster, wait_for

REPO = Path(__file__).resolve().parents[2]
QUEUES = REPO / "manifests" / "examples" / "kueue" / "queues.yaml"
LOCAL_QUEUE = "team-queue"
GPU_2X8 = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}}  # the whole GPU quota


@pytest.fixture(scope="module")
def kueue_running(cluster: Cluster, mpi_operator: None) -> Iterator[None]:
    """Kueue and the example's cluster-scoped queues, all removed afterwards. Module scope:
    the operator fixture (per test) starts after Kueue's CRDs exist, as kopf needs. The MPI
    Operator first: Kueue's MPIJob integration starts at once where the kind is served."""
    dev_cluster = load_dev_cluster()
    if os.geteuid() != 0 and not IN_CI:  # in CI, running() fails loudly instead
        pytest.skip("Kueue out of cluster needs root (a private mount namespace for its certs)")
    try:
        dev_cluster.built("kueue")  # built in the background before the tier, unless that failed
    except dev_cluster.BuildError as error:
        if not IN_CI:
            pytest.skip(f"Kueue could not be built: {error}")
        raise
    with dev_cluster.kueue.running(dev_cluster.running_state()):
        # Kueue's webhooks check these objects as they are created: the example is valid.
        cluster.kubectl("apply", f"--filename={QUEUES}", "--namespace=default")
        cluster.kubectl("delete", "localqueue", LOCAL_QUEUE, "--namespace=default")
        yield


CLUSTER_QUEUE = "accelerators"  # the example's ClusterQueue, behind LOCAL_QUEUE


@pytest.fixture
def queued(kueue_running: None, cluster: Cluster, namespace: str) -> str:
    """The example's LocalQueue in the test's namespace, once the quota is all free: a job an
    earlier test left running keeps its quota until its namespace is gone, and these tests
    count on the whole of it."""
    cluster.kubectl("apply", f"--filename={QUEUES}", f"--namespace={namespace}")

    def quota_free() -> bool:
        queue = cluster.custom_objects.get_cluster_custom_object(
            kueue.GROUP, kueue.VERSION, "clusterqueues", CLUSTER_QUEUE
        )
        return not (queue.get("status") or {}).get("reservingWorkloads")

    wait_for(quota_free, f"ClusterQueue {CLUSTER_QUEUE} to reserve no quota", timeout=180)
    return LOCAL_QUEUE


def queued_job(name: str, queue: str, priority: str | None = None, **spec: Any) -> dict[str, Any]:
    manifest = job_manifest(name, **GPU_2X8, **spec)
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: queue}
    if priority:
        manifest["metadata"]["labels"][kueue.PRIORITY_CLASS_LABEL] = priority
    return manifest


def workload_of(jobs: Jobs, name: str) -> dict[str, Any]:
    job = load_job(jobs.get(name))
    found: dict[str, Any] = jobs.cluster.custom_objects.get_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, jobs.namespace, kueue.WORKLOADS, kueue.workload_name(job)
    )
    return found


def condition(jobs: Jobs, name: str, type_: str) -> dict[str, Any]:
    found = {c["type"]: c for c in jobs.status(name).get("conditions", [])}
    return dict(found.get(type_) or {})


def wait_suspended(jobs: Jobs, name: str, reason: str) -> dict[str, Any]:
    def suspended() -> dict[str, Any] | None:
        found = condition(jobs, name, "Suspended")
        ok = jobs.status(name).get("phase") == "Suspended" and found.get("reason") == reason
        return found if ok else None

    return wait_for(suspended, f"{name} Suspended ({reason})", timeout=60)


def wait_kueue_says(jobs: Jobs, name: str, words: str) -> dict[str, Any]:
    """The job's Suspended condition once it is Queued with Kueue's `words`: they follow
    Kueue's first try, which may come after the job is first Queued."""
    wait_suspended(jobs, name, "Queued")

    def said() -> dict[str, Any] | None:
        found = condition(jobs, name, "Suspended")
        return found if words in found.get("message", "") else None

    return wait_for(said, f"Kueue's words on {name}")


def test_a_queued_job_waits_for_kueue_installed_after_the_operator(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess, mpi_operator: None
) -> None:
    """The operator started first: a queued job waits, saying Kueue is needed, makes no pod,
    and is admitted and runs once Kueue is there (the job has kopf look at Kueue's group
    again: no restart). First in the module: Kueue is not yet installed for it."""
    dev_cluster = load_dev_cluster()
    if os.geteuid() != 0 and not IN_CI:
        pytest.skip("Kueue out of cluster needs root (a private mount namespace for its certs)")
    dev_cluster.built("kueue")
    jobs.create(queued_job("early", LOCAL_QUEUE))
    status = jobs.wait_phase("early", "Pending")
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert (created["reason"], kueue.NOT_SERVED) == ("KindNotServed", created["message"])
    assert not jobs.pods("early")
    with dev_cluster.kueue.running(dev_cluster.running_state()):
        cluster.kubectl("apply", f"--filename={QUEUES}", f"--namespace={jobs.namespace}")
        jobs.wait_pods("early", 2, timeout=90)  # the job looks again within 30 s
        jobs.wait_phase("early", "Running")
        assert workload_of(jobs, "early")["metadata"]["ownerReferences"][0]["name"] == "early"
        jobs.delete("early")
        wait_for(lambda: not jobs.pods("early"), "its pods to go before Kueue does", timeout=60)


def test_second_job_waits_for_the_quota(queued: str, jobs: Jobs, operator: OperatorProcess) -> None:
    # A gang too: Kueue's quota first, then kube-scheduler places both workers or neither.
    jobs.create(queued_job("first", queued, scheduling={"gang": {}}))
    pods = jobs.wait_pods("first", 2, timeout=60)
    for pod in pods:  # the admitted flavor's node labels, merged into the pods' selector
        assert pod.spec.node_selector == {"kubeddp.io/accelerator": "nvidia"}
        assert pod.spec.scheduling_group.pod_group_name == "first"
    assert jobs.get("first")["spec"]["runPolicy"]["suspend"] is False
    workload = workload_of(jobs, "first")
    assert workload["metadata"]["ownerReferences"][0]["name"] == "first"
    (pod_set,) = workload["spec"]["podSets"]
    assert pod_set["count"] == 2
    requests = pod_set["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] in (8, "8")
    jobs.wait_phase("first", "Running")

    def pods_ready() -> bool:
        ready = kueue.conditions(workload_of(jobs, "first")).get("PodsReady") or {}
        return ready.get("status") == "True"

    wait_for(pods_ready, "PodsReady=True on first's Workload")

    jobs.create(queued_job("second", queued))
    waiting = wait_kueue_says(jobs, "second", "insufficient unused quota for nvidia.com/gpu")
    assert waiting["message"].startswith(f"Queued in LocalQueue {queued}: ")
    assert jobs.pods("second") == []
    assert jobs.get("second")["spec"]["runPolicy"]["suspend"] is True

    jobs.end_worker("first-worker-0", 0)
    jobs.wait_phase("first", "Succeeded")
    wait_for(lambda: kueue.is_finished(workload_of(jobs, "first")), "first's Workload Finished", 30)
    jobs.wait_pods("second", 2, timeout=60)
    status = jobs.wait_phase("second", "Running")
    assert condition(jobs, "second", "Suspended")["status"] == "False"
    assert status["restarts"] == 0


def test_higher_priority_preempts_and_the_lower_resumes(
    queued: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(queued_job("low", queued, priority="research"))
    before = jobs.wait_pods("low", 2, timeout=60)
    jobs.wait_phase("low", "Running")

    jobs.create(queued_job("high", queued, priority="production"))
    preempted = wait_suspended(jobs, "low", "Preempted")
    assert "Preempted" in preempted["message"]
    status = jobs.status("low")
    assert status["phase"] == "Suspended"  # not Failed
    assert status["restarts"] == 0
    # a preemption, said by what; the job queued from its start was never preempted
    assert (status["preemptions"], status["lastPreemption"]["reason"]) == (1, "Preempted")
    assert jobs.status("high").get("preemptions", 0) == 0
    assert "Failed" not in {c["type"] for c in status["conditions"] if c["status"] == "True"}
    jobs.wait_pods("high", 2, timeout=60)
    jobs.wait_phase("high", "Running")
    wait_for(lambda: not jobs.pods("low"), "low's pods removed", 30)

    jobs.end_worker("high-worker-0", 0)
    jobs.wait_phase("high", "Succeeded")
    after = jobs.wait_pods("low", 2, timeout=60)
    status = jobs.wait_phase("low", "Running")
    assert status["restarts"] == 0  # an eviction is not a failure
    assert {p.metadata.uid for p in after}.isdisjoint(p.metadata.uid for p in before)
    # The same attempt: the trainer reads its checkpoint and goes on from its last epoch.
    assert [env_of(p)["KUBEDDP_ATTEMPT"] for p in after] == ["0", "0"]
    assert condition(jobs, "low", "Suspended")["status"] == "False"


def test_a_job_without_the_label_is_left_alone(
    queued: str, cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("free", **GPU_2X8))
    jobs.wait_pods("free", 2)
    jobs.wait_phase("free", "Running")
    job = jobs.get("free")
    assert job["spec"]["runPolicy"].get("suspend", False) is False
    assert job["spec"].get("template", {}).get("nodeSelector") is None
    listed = cluster.custom_objects.list_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, jobs.namespace, kueue.WORKLOADS
    )
    assert listed["items"] == []


# --- launcher mpi: the MPI Operator's launcher and workers, two pod sets ------------------

MPI_2X8 = {"launcher": "mpi", "mpi": {"socketsPerNode": 1, "coresPerProcess": 1}}


def mpi_pods(jobs: Jobs, name: str, role: str) -> list[Any]:
    return [
        p
        for p in jobs.pods(name)
        if p.metadata.labels.get(names.MPI_LABEL_ROLE) == role
        and p.status.phase == "Running"
        and p.metadata.deletion_timestamp is None
    ]


def mpijob_of(jobs: Jobs, name: str) -> dict[str, Any]:
    found: dict[str, Any] = jobs.cluster.custom_objects.get_namespaced_custom_object(
        "kubeflow.org", "v2beta1", jobs.namespace, names.MPIJOB_PLURAL, name
    )
    return found


def wait_mpi_running(jobs: Jobs, name: str) -> tuple[Any, list[Any]]:
    """The running launcher and workers of a job Running through its MPIJob."""
    jobs.wait_phase(name, "Running", timeout=60)
    (launcher,) = wait_for(lambda: mpi_pods(jobs, name, "launcher"), f"{name}'s launcher")
    return launcher, mpi_pods(jobs, name, "worker")


def test_mpi_job_waits_for_the_quota_then_runs_on_each_pod_sets_flavor(
    queued: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(queued_job("mpi-first", queued, **MPI_2X8))
    launcher, workers = wait_mpi_running(jobs, "mpi-first")
    launcher_set, worker_set = workload_of(jobs, "mpi-first")["spec"]["podSets"]
    assert (launcher_set["name"], launcher_set["count"]) == ("launcher", 1)
    assert (worker_set["name"], worker_set["count"]) == ("worker", 2)
    # Each pod set took the first flavor with room for its requests: the launcher's CPU and
    # memory fit nvidia's, as the workers' GPUs do.
    assert sorted(p.spec.node_name for p in workers) == ["gpu-node-0", "gpu-node-1"]
    for pod in (launcher, *workers):
        assert pod.spec.node_selector == {"kubeddp.io/accelerator": "nvidia"}
    # Kueue's MPIJob integration (enabled: hack/devcluster/kueue.py) takes this MPIJob for a
    # child of a job it knows: the job's Workload is the only one.
    listed = jobs.cluster.custom_objects.list_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, jobs.namespace, kueue.WORKLOADS
    )
    assert [w["metadata"]["name"] for w in listed["items"]] == [
        workload_of(jobs, "mpi-first")["metadata"]["name"]
    ]

    jobs.create(queued_job("mpi-second", queued, **MPI_2X8))
    wait_kueue_says(jobs, "mpi-second", "insufficient unused quota for nvidia.com/gpu")
    assert mpijob_of(jobs, "mpi-second")["spec"]["runPolicy"]["suspend"] is True
    assert jobs.pods("mpi-second") == []

    jobs.end_worker(launcher.metadata.name, 0)
    jobs.wait_phase("mpi-first", "Succeeded")
    wait_for(
        lambda: kueue.is_finished(workload_of(jobs, "mpi-first")), "mpi-first's Workload Finished"
    )
    launcher, workers = wait_mpi_running(jobs, "mpi-second")
    assert {p.spec.node_selector["kubeddp.io/accelerator"] for p in workers} == {"nvidia"}
    assert jobs.status("mpi-second")["restarts"] == 0
    end_mpi_job(jobs, "mpi-second", launcher)


def end_mpi_job(jobs: Jobs, name: str, launcher: Any) -> None:
    """mpirun exits 0: the workers go (cleanPodPolicy Running), the GPUs free for the next test."""
    jobs.end_worker(launcher.metadata.name, 0)
    jobs.wait_phase(name, "Succeeded")
    wait_for(lambda: not mpi_pods(jobs, name, "worker"), f"{name}'s workers removed")


def test_a_preempted_mpi_job_is_suspended_and_resumes_without_a_restart(
    queued: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(queued_job("mpi-low", queued, priority="research", **MPI_2X8))
    _, before = wait_mpi_running(jobs, "mpi-low")

    jobs.create(queued_job("high", queued, priority="production"))
    preempted = wait_suspended(jobs, "mpi-low", "Preempted")
    assert "Preempted" in preempted["message"]
    assert mpijob_of(jobs, "mpi-low")["spec"]["runPolicy"]["suspend"] is True
    jobs.wait_pods("high", 2, timeout=60)
    wait_for(lambda: not mpi_pods(jobs, "mpi-low", "worker"), "mpi-low's workers removed", 30)
    assert jobs.status("mpi-low")["restarts"] == 0

    jobs.end_worker("high-worker-0", 0)
    jobs.wait_phase("high", "Succeeded")
    launcher, after = wait_mpi_running(jobs, "mpi-low")
    status = jobs.status("mpi-low")
    assert status["restarts"] == 0  # an eviction is not a failure
    assert condition(jobs, "mpi-low", "Suspended")["status"] == "False"
    assert {p.metadata.uid for p in after}.isdisjoint(p.metadata.uid for p in before)
    # the same MPIJob, resumed: the same attempt
    assert mpijob_of(jobs, "mpi-low")["metadata"]["labels"][names.LABEL_ATTEMPT] == "0"
    end_mpi_job(jobs, "mpi-low", launcher)


# --- topology-aware placement (Kueue's TAS) -----------------------------------------------
# The Topology, ResourceFlavor and queues of manifests/examples/kueue/topology.yaml, on five
# kwok nodes of 8 GPUs labelled by block and rack: block a holds racks a1 and a2 of two nodes
# each, block b rack b1 of one. Kueue picks the domain; its topology ungater writes each gated
# worker's node into its nodeSelector; kube-scheduler binds it there. In this module, so that
# Kueue starts once: a Kueue stopped leaves its CRDs terminating (its finalizers stay on its
# objects), so a second start in the same cluster fails.

TOPOLOGY = REPO / "manifests" / "examples" / "kueue" / "topology.yaml"
RACKED_QUEUE = "racked-queue"
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
def racked(kueue_running: None, cluster: Cluster) -> Iterator[None]:
    """The racked nodes and the example's cluster-scoped objects, removed afterwards."""
    for name, rack in NODES.items():
        cluster.core.create_node(racked_node(name, rack))
    try:
        cluster.kubectl("apply", f"--filename={TOPOLOGY}", "--namespace=default")
        cluster.kubectl("delete", "localqueue", RACKED_QUEUE, "--namespace=default")
        yield
    finally:
        cluster.kubectl("delete", f"--filename={TOPOLOGY}", "--ignore-not-found", "--wait=false")
        for name in NODES:
            cluster.core.delete_node(name)


@pytest.fixture
def racked_queue(racked: None, cluster: Cluster, namespace: str) -> str:
    """The example's LocalQueue in the test's namespace, once the racked nodes are empty: an
    earlier test's pods or admitted Workload, still going, would leave Kueue less room than
    the test counts on."""

    def empty() -> bool:
        pods = cluster.core.list_pod_for_all_namespaces(label_selector=kueue.POD_SET_LABEL)
        workloads = cluster.custom_objects.list_cluster_custom_object(
            kueue.GROUP, kueue.VERSION, kueue.WORKLOADS
        )["items"]
        return not any(p.spec.node_name in NODES for p in pods.items) and not any(
            kueue.is_admitted(w) and not kueue.is_finished(w) for w in workloads
        )

    wait_for(empty, "no pod on the racked nodes, no admitted Workload", timeout=60)
    cluster.kubectl("apply", f"--filename={TOPOLOGY}", f"--namespace={namespace}")
    return RACKED_QUEUE


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
    racked_queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    in_rack = topology_job("in-rack", racked_queue, 2, "Required")
    in_rack["spec"]["runPolicy"] = {"restartStrategy": "Recreate"}  # a group restart, below
    jobs.create(in_rack)
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
    jobs.delete("in-rack")  # its Workload goes with it, sooner than with the namespace


def placed_mpi_pods(jobs: Jobs, name: str) -> tuple[Any, list[Any]]:
    """The running launcher and workers of an MPI job, each where Kueue put it: its ungater
    removed the gate and named the node in the nodeSelector."""
    launcher, workers = wait_mpi_running(jobs, name)
    workload = workload_of(jobs, name)["metadata"]["name"]
    for pod in (launcher, *workers):
        assert not pod.spec.scheduling_gates
        assert pod.spec.node_selector.get("kubernetes.io/hostname") == pod.spec.node_name
        assert pod.spec.node_selector["kubeddp.io/pool"] == "racked"  # the flavor's
        assert pod.metadata.annotations[kueue.WORKLOAD_ANNOTATION] == workload
    return launcher, workers


def test_an_mpi_job_that_fits_a_rack_runs_its_workers_in_one(
    mpi_operator: None, racked_queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    manifest = topology_job("mpi-in-rack", racked_queue, 2, "Required")
    manifest["spec"].update(MPI_2X8)
    jobs.create(manifest)
    launcher, workers = placed_mpi_pods(jobs, "mpi-in-rack")
    racks = {NODES[p.spec.node_name] for p in workers}
    assert len(workers) == 2 and len(racks) == 1
    assert NODES[launcher.spec.node_name] in RACKS  # unconstrained: any node of the flavor
    launcher_set, worker_set = workload_of(jobs, "mpi-in-rack")["status"]["admission"][
        "podSetAssignments"
    ]
    assert launcher_set["name"] == "launcher" and launcher_set["topologyAssignment"]
    assert worker_set["topologyAssignment"]["levels"] == ["kubernetes.io/hostname"]
    end_mpi_job(jobs, "mpi-in-rack", launcher)
    jobs.delete("mpi-in-rack")


def test_an_mpi_job_without_a_topology_is_still_placed_by_kueue(
    mpi_operator: None, racked_queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Every flavor names a Topology: Kueue places both pod sets (its implicit TAS), the
    launcher by its own small request; the MPIJob, created before the admission, is resumed
    with both templates marked and gated."""
    jobs.create(queued_job("mpi-racked", racked_queue, **MPI_2X8))
    launcher, workers = placed_mpi_pods(jobs, "mpi-racked")
    assert len(workers) == 2
    for pod in (launcher, *workers):
        assert pod.metadata.annotations[kueue.UNCONSTRAINED_ANNOTATION] == "true"
    end_mpi_job(jobs, "mpi-racked", launcher)
    jobs.delete("mpi-racked")


def test_a_job_that_fits_no_rack_waits_saying_why(
    racked_queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(topology_job("too-wide", racked_queue, 3, "Required"))  # no rack has 3 nodes
    words = 'topology "racks" allows to fit only 2 out of 3 pod(s)'
    waiting = wait_kueue_says(jobs, "too-wide", words)
    assert waiting["message"].startswith(f"Queued in LocalQueue {racked_queue}: ")
    assert jobs.pods("too-wide") == []
    assert jobs.get("too-wide")["spec"]["runPolicy"]["suspend"] is True


def test_preferred_takes_one_block_when_no_rack_fits(
    racked_queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(topology_job("spread", racked_queue, 3, "Preferred"))
    racks = racks_of(jobs, "spread", 3)
    assert {RACKS[r] for r in racks} == {"a"}  # one block, two racks: the next level up
    assert len(set(racks)) == 2
    jobs.wait_phase("spread", "Running")
    jobs.delete("spread")


def test_a_job_without_a_topology_is_still_placed_by_kueue(
    racked_queue: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    """The flavor names a Topology, so Kueue assigns nodes to a job that asked for none (its
    implicit TAS): the workers wait at the gate for them like any other TAS pods."""
    jobs.create(queued_job("unasked", racked_queue))
    assert len(racks_of(jobs, "unasked", 2)) == 2
    annotations = jobs.get("unasked")["spec"]["template"]["annotations"]
    assert annotations == {kueue.UNCONSTRAINED_ANNOTATION: "true"}
    jobs.wait_phase("unasked", "Running")
    jobs.delete("unasked")
