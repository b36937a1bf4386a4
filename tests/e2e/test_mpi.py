"""`launcher: mpi` for real: the Kubeflow MPI Operator (beside the cluster) makes a launcher and
two worker pods on the real node; the workers run sshd, the launcher runs the mpirun line kube-ddp
renders, which starts the ranks over ssh between the pods; they train, rank 0 reports progress,
and the job ends Succeeded. As the trainer image runs it: as its user (uid 10001, not root: the
pods' runAsNonRoot makes the kubelet check it), sshd on port 2222 with the ssh keys in that
user's home (the default sshAuthMountPath, /home/trainer/.ssh), every container with no
capabilities and no privilege escalation. (Not in a namespace that enforces `restricted`: the
launcher takes no claims, so the host directories the stand-in image needs can only reach it
as hostPath volumes; tests/cluster/test_pod_security.py runs an MPI job in one on kwok.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kube_ddp import kueue, names
from kube_ddp.api import load_job
from tests.cluster.conftest import IN_CI
from tests.cluster.operator_support import Jobs, job_manifest
from tests.cluster.support import load_dev_cluster, wait_for
from tests.e2e.conftest import OPERATOR_NAMESPACE, RELEASE
from tests.e2e.platform import DevPlatform, Platform
from tests.e2e.test_jobs import DIGITS, TRAINING_TIMEOUT
from tests.host_tools import require

pytestmark = pytest.mark.usefixtures("mpi_operator")


def test_mpirun_over_ssh_between_pods_trains_to_succeeded(platform: Platform, jobs: Jobs) -> None:
    if not isinstance(platform, DevPlatform):
        pytest.skip("the MPI Operator runs beside the dev cluster only (hack/devcluster)")
    # The pods run the host's /usr (tests/e2e/platform.py): mpirun, ssh and sshd come from it.
    require("MPI_PODS")
    trainer = {**DIGITS, "model": "mlp", "epochs": 40, "targetAccuracy": 0.9, "patience": 2}
    mpi = {"socketsPerNode": 1, "coresPerProcess": 1}
    spec: dict[str, Any] = {"nodes": 2, "launcher": "mpi", "mpi": mpi, "trainer": trainer}
    jobs.create(job_manifest("mpi-digits", **platform.job_spec(spec)))
    status = jobs.wait_phase("mpi-digits", "Succeeded", timeout=TRAINING_TIMEOUT)

    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert succeeded["reason"] == "LauncherSucceeded"
    assert status["restarts"] == 0, status.get("failure")
    # rank 0, started over ssh, reached the API server (KUBERNETES_SERVICE_* passed on by -x)
    assert status["training"]["valAccuracy"] >= 0.9
    (launcher,) = [
        p for p in jobs.pods("mpi-digits") if p.metadata.labels[names.MPI_LABEL_ROLE] == "launcher"
    ]
    assert launcher.spec.security_context.run_as_non_root is True
    assert launcher.spec.containers[0].security_context.capabilities.drop == ["ALL"]
    said = str(jobs.cluster.core.read_namespaced_pod_log(launcher.metadata.name, jobs.namespace))
    # two pods of one rank each, reached by ssh through the MPI Operator's host file
    assert "launcher=openmpi" in said
    assert "rank=1 world_size=2 local_rank=0 local_world_size=1 node_rank=1" in said, said[-3000:]


# --- queued: real Kueue (beside the cluster, hack/devcluster/kueue.py) admits it ----------

LOCAL_QUEUE = "e2e-queue"


def _restart_operator(platform: Platform) -> None:
    """A new operator pod: kopf looks up the kinds it watches (Kueue's Workloads) when it
    starts."""
    deployment = (f"deployment/{RELEASE}", f"--namespace={OPERATOR_NAMESPACE}")
    platform.cluster.kubectl("rollout", "restart", *deployment)
    platform.cluster.kubectl("rollout", "status", *deployment, "--timeout=120s")


@pytest.fixture
def local_queue(platform: Platform, operator: dict[str, Any], namespace_e2e: str) -> Iterator[str]:
    """Kueue running, a ClusterQueue of one flavor for the real node and a LocalQueue in the
    test's namespace, and the operator restarted to watch Workloads (and again afterwards)."""
    if not isinstance(platform, DevPlatform):
        pytest.skip("Kueue runs beside the dev cluster only (hack/devcluster)")
    dev_cluster = load_dev_cluster()
    try:
        dev_cluster.built("kueue")
    except dev_cluster.BuildError as error:
        if not IN_CI:
            pytest.skip(f"Kueue could not be built: {error}")
        raise
    queues = [
        {"apiVersion": kueue.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": "e2e"}},
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "ClusterQueue",
            "metadata": {"name": "e2e"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": "e2e",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 64},
                                    {"name": "memory", "nominalQuota": "256Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace_e2e},
            "spec": {"clusterQueue": "e2e"},
        },
    ]
    try:
        with dev_cluster.kueue.running(dev_cluster.running_state()):
            items = {"apiVersion": "v1", "kind": "List", "items": queues}
            platform.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(items))
            _restart_operator(platform)
            yield LOCAL_QUEUE
    finally:
        _restart_operator(platform)  # Workloads are no longer served


def test_a_queued_mpi_job_is_admitted_and_trains(
    platform: Platform, jobs: Jobs, local_queue: str
) -> None:
    require("MPI_PODS")
    trainer = {**DIGITS, "model": "mlp", "epochs": 40, "targetAccuracy": 0.9, "patience": 2}
    mpi = {"socketsPerNode": 1, "coresPerProcess": 1}
    spec: dict[str, Any] = {"nodes": 2, "launcher": "mpi", "mpi": mpi, "trainer": trainer}
    manifest = job_manifest("mpi-queued", **platform.job_spec(spec))
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: local_queue}
    jobs.create(manifest)
    status = jobs.wait_phase("mpi-queued", "Succeeded", timeout=TRAINING_TIMEOUT)
    assert status["restarts"] == 0, status.get("failure")
    assert status["training"]["valAccuracy"] >= 0.9
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("False", "Resumed")  # Kueue admitted it
    job = load_job(jobs.get("mpi-queued"))
    workload = workload_of(jobs, job)
    assert [p["name"] for p in workload["spec"]["podSets"]] == ["launcher", "worker"]
    wait_for(lambda: kueue.is_finished(workload_of(jobs, job)), "the Workload Finished", 30)


def workload_of(jobs: Jobs, job: Any) -> dict[str, Any]:
    found: dict[str, Any] = jobs.cluster.custom_objects.get_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, jobs.namespace, kueue.WORKLOADS, kueue.workload_name(job)
    )
    return found
