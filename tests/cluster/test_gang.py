"""Gang scheduling on the real control plane: Kubernetes' own (scheduling.k8s.io/v1alpha2
PodGroup, kube-scheduler's GangScheduling plugin, enabled in hack/devcluster/controlplane.py)
with kwok's GPU nodes, and the PodGroups of scheduler-plugins and Volcano against their CRDs
from the Go module cache (server-side dry runs: neither scheduler runs here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_ddp import gang
from kube_ddp.api import load_job
from kube_ddp.launchers import build_children
from tests.cluster.operator_support import Jobs, OperatorProcess, job_manifest
from tests.cluster.support import Cluster, load_dev_cluster, wait_for

GPU = {"type": "nvidia", "perNode": 8}  # hack/nodes.yaml: two nodes of 8 GPUs


def schedulable(jobs: Jobs, name: str) -> dict[str, str] | None:
    conditions = {c["type"]: c for c in jobs.status(name).get("conditions", [])}
    return conditions.get("Schedulable")


def gpu_nodes_free(cluster: Cluster) -> bool:
    """No pod of an earlier test (its namespace is deleted in the background) holds a GPU."""
    active = "status.phase!=Succeeded,status.phase!=Failed"
    pods = cluster.core.list_pod_for_all_namespaces(field_selector=active).items
    return not [p for p in pods if (p.spec.node_name or "").startswith("gpu-node-")]


def test_a_gang_that_does_not_fit_places_no_worker(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Three workers of 8 GPUs, room for two: without a gang two would start and hold 16 GPUs
    while waiting for the third; with one, none is bound."""
    wait_for(lambda: gpu_nodes_free(cluster), "the GPU nodes free of earlier tests' pods", 60)
    jobs.create(job_manifest("big", nodes=3, accelerator=GPU, scheduling={"gang": {}}))

    def says_so() -> dict[str, str] | None:
        found = schedulable(jobs, "big")
        return found if found and found["status"] == "False" else None

    condition = wait_for(says_so, "Schedulable=False on the gang's job")
    assert condition["reason"] == "Unschedulable"
    assert condition["message"].startswith("PodGroup big (3 of 3 workers together): big-worker-")

    # The worker named is one the scheduler tried: its words depend on the order it tried
    # them in (the others' GPUs held for the gang, or the gang waiting); the PodGroup's verdict
    # does not.
    def unplaced_gang() -> dict[str, Any] | None:
        group: dict[str, Any] = jobs.cluster.custom_objects.get_namespaced_custom_object(
            "scheduling.k8s.io", "v1alpha2", jobs.namespace, "podgroups", "big"
        )
        conditions = (group.get("status") or {}).get("conditions", [])
        verdict = [c for c in conditions if c["type"] == "PodGroupScheduled"]
        return group if verdict and verdict[0]["status"] == "False" else None

    group = wait_for(unplaced_gang, "PodGroupScheduled=False on the PodGroup")
    pods = jobs.pods("big")
    assert len(pods) == 3
    assert [p.spec.node_name for p in pods] == [None, None, None]
    assert {p.spec.scheduling_group.pod_group_name for p in pods} == {"big"}
    assert jobs.status("big")["phase"] == "Pending"
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert group["metadata"]["ownerReferences"][0]["kind"] == "DDPTrainingJob"


def test_a_gang_that_fits_starts_together(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("pair", nodes=2, accelerator=GPU, scheduling={"gang": {}}))
    pods = jobs.wait_pods("pair", 2)
    assert sorted(p.spec.node_name for p in pods) == ["gpu-node-0", "gpu-node-1"]
    status = jobs.wait_phase("pair", "Running")
    assert {c["type"]: c["status"] for c in status["conditions"]}["Schedulable"] == "True"
    assert status["restarts"] == 0


# --- the PodGroups of the other two schedulers, against their CRDs ----------------------

# The module and file of each scheduler's PodGroup CRD, in the Go module cache.
CRDS = {
    # (a path of that module's, not of this repository)
    "coscheduling": (
        "sigs.k8s.io/scheduler-plugins",
        str(Path("manifests", "coscheduling", "crd.yaml")),
    ),
    "volcano": (
        "volcano.sh/volcano",
        "config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml",
    ),
}


@pytest.fixture(scope="module")
def gang_crds(cluster: Cluster) -> Iterator[None]:
    """The two PodGroup CRDs applied (server-side), deleted afterwards."""
    dev_cluster = load_dev_cluster()
    versions = {
        "sigs.k8s.io/scheduler-plugins": dev_cluster.SCHEDULER_PLUGINS_VERSION,
        "volcano.sh/volcano": dev_cluster.VOLCANO_VERSION,
    }
    files = [dev_cluster.module_dir(m, versions[m]) / path for m, path in CRDS.values()]
    for file in files:
        cluster.kubectl("apply", "--server-side", f"--filename={file}")
    names = [yaml.safe_load(Path(f).read_text())["metadata"]["name"] for f in files]

    def established() -> bool:  # polled: `kubectl wait` fails on a CRD without conditions yet
        listed = json.loads(cluster.kubectl("get", *(f"crd/{n}" for n in names), "-o=json").stdout)
        return all(
            any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
            for crd in listed["items"]
            for conditions in [crd.get("status", {}).get("conditions") or []]
        )

    wait_for(established, "the PodGroup CRDs to be established")
    yield
    for name in names:
        cluster.kubectl("delete", f"crd/{name}", "--ignore-not-found")


def dry_run_create(cluster: Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server would store (kubectl's server-side dry run, as render is checked)."""
    done = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(obj)
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("scheduler", ["coscheduling", "volcano"])
def test_other_schedulers_accept_the_pod_group(
    cluster: Cluster, namespace: str, gang_crds: None, scheduler: str
) -> None:
    gang_spec = {"scheduler": scheduler, "minMember": 2}
    gang_spec |= {"coscheduling": {"scheduleTimeoutSeconds": 60}, "volcano": {"queue": "default"}}[
        scheduler
    ]
    job = load_job(
        job_manifest("g", nodes=3, accelerator=GPU, scheduling={"gang": gang_spec}), namespace
    )
    children = build_children(job)
    (group,) = [c for c in children if c["kind"] == "PodGroup"]
    stored = dry_run_create(cluster, group)
    assert stored["spec"]["minMember"] == 2  # kept by the CRD's structural schema
    kind = gang.KINDS[scheduler]
    for pod in (c for c in children if c["kind"] == "Pod"):
        # The job's own account is not created here: the admission plugin wants one that exists.
        pod["spec"]["serviceAccountName"] = "default"
        accepted = dry_run_create(cluster, pod)
        assert accepted["spec"]["schedulerName"] == kind.scheduler_name
        joined = {
            **accepted["metadata"].get("labels", {}),
            **accepted["metadata"].get("annotations", {}),
        }
        assert joined[kind.label or kind.annotation or ""] == "g"


# --- launcher mpi: the MPI Operator creates the pods ---------------------------------------

MPI = {"launcher": "mpi", "mpi": {"socketsPerNode": 1, "coresPerProcess": 1}}


def test_the_mpijob_crd_drops_a_templates_scheduling_group(
    cluster: Cluster, namespace: str, mpi_operator: None
) -> None:
    """Why a kubernetes gang is refused with launcher mpi: the MPI Operator's CRD (v0.8.2, built
    on Kubernetes 1.35's PodSpec) prunes spec.schedulingGroup, so its pods could never join the
    PodGroup. Once it keeps the field, the refusal (api.py) can go."""
    job = load_job(job_manifest("g", nodes=2, accelerator=GPU, **MPI), namespace)
    (mpijob,) = [c for c in build_children(job) if c["kind"] == "MPIJob"]
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["schedulingGroup"] = {"podGroupName": "g"}
    # Unknown to the schema: refused under strict validation, else pruned with a warning.
    done = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(mpijob), check=False
    )
    assert done.returncode != 0
    field = "spec.mpiReplicaSpecs.Worker.template.spec.schedulingGroup"
    assert f'unknown field "{field}"' in done.stderr


def test_an_mpi_gang_reaches_the_mpi_operators_pods(
    mpi_operator: None, gang_crds: None, jobs: Jobs, operator: OperatorProcess
) -> None:
    """The launcher and both workers, created by the MPI Operator, join the job's coscheduling
    PodGroup (3 members) and wait for its scheduler (none runs here: nothing is bound)."""
    gang_spec = {"gang": {"scheduler": "coscheduling"}}
    jobs.create(job_manifest("mg", nodes=2, accelerator=GPU, scheduling=gang_spec, **MPI))
    pods = wait_for(lambda: len(found := jobs.pods("mg")) == 3 and found, "3 pods of mg")
    roles = sorted(p.metadata.labels["training.kubeflow.org/job-role"] for p in pods)
    assert roles == ["launcher", "worker", "worker"]  # the launcher created with the workers
    kind = gang.KINDS["coscheduling"]
    for pod in pods:
        assert pod.metadata.labels[kind.label or ""] == "mg"
        assert pod.spec.scheduler_name == kind.scheduler_name
        assert pod.spec.node_name is None
    group: dict[str, Any] = jobs.cluster.custom_objects.get_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", jobs.namespace, "podgroups", "mg"
    )
    assert group["spec"]["minMember"] == 3
    assert group["metadata"]["ownerReferences"][0]["kind"] == "DDPTrainingJob"
    assert jobs.status("mg")["phase"] == "Pending"


def test_an_mpi_gang_naming_no_scheduler_gets_volcano_where_served(
    mpi_operator: None, gang_crds: None, jobs: Jobs, operator: OperatorProcess
) -> None:
    """`gang: {}` with launcher mpi on a cluster serving all three PodGroups: kubernetes' is
    skipped (the MPI Operator drops schedulingGroup), Volcano's comes before coscheduling's."""
    jobs.create(job_manifest("ag", nodes=2, accelerator=GPU, scheduling={"gang": {}}, **MPI))
    pods = wait_for(lambda: len(found := jobs.pods("ag")) == 3 and found, "3 pods of ag")
    kind = gang.KINDS["volcano"]
    for pod in pods:
        assert pod.metadata.annotations[kind.annotation or ""] == "ag"
        assert pod.spec.scheduler_name == kind.scheduler_name
    group: dict[str, Any] = jobs.cluster.custom_objects.get_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", jobs.namespace, "podgroups", "ag"
    )
    assert group["spec"]["minMember"] == 3
    stored = jobs.cluster.custom_objects.get_namespaced_custom_object(
        "kubeddp.io", "v1alpha1", jobs.namespace, "ddptrainingjobs", "ag"
    )
    assert stored["spec"]["scheduling"]["gang"] == {}  # the job itself is left as written
