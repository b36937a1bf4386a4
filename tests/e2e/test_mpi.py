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

from typing import Any

import pytest

from kube_ddp import names
from tests.cluster.operator_support import Jobs, job_manifest
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
