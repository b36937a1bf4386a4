"""When the real API server's admission says no to a job's pods (docs/design.md, "When admission
says no"): PodSecurity and a ValidatingAdmissionPolicy fail the job with the server's words, a
full ResourceQuota holds it without leaving half a group, and it starts once there is room."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import kubernetes
import pytest

from tests.cluster.operator_support import Jobs, OperatorProcess, job_manifest
from tests.cluster.support import Cluster, wait_for

GPU_2X8 = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}}


def failed_condition(jobs: Jobs, name: str) -> dict[str, str]:
    status = jobs.wait_phase(name, "Failed")
    (failed,) = [c for c in status["conditions"] if c["type"] == "Failed"]
    return failed


def test_a_job_the_namespaces_pod_security_level_refuses_fails_saying_why(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Gaudi's device plugin needs hostIPC, which even `baseline` refuses."""
    level = {"pod-security.kubernetes.io/enforce": "restricted"}
    cluster.core.patch_namespace(jobs.namespace, {"metadata": {"labels": level}})
    jobs.create(job_manifest("hpu", nodes=2, accelerator={"type": "gaudi", "perNode": 8}))
    failed = failed_condition(jobs, "hpu")
    assert failed["reason"] == "PodSecurityViolation"
    message = failed["message"]
    assert 'violates PodSecurity "restricted:latest"' in message and "hostIPC" in message
    assert "spec.template" in message  # what to change
    assert "\n" not in message
    jobs.wait_events("hpu", "PodSecurityViolation")
    wait_for(lambda: not jobs.pods("hpu"), "no pod of the refused job left")


@pytest.mark.usefixtures("mpi_operator")
def test_an_mpi_job_whose_pods_the_level_refuses_fails_before_its_mpijob(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """The MPI Operator creates the pods of `launcher: mpi`, and what the server says to it
    never reaches the job: kube-ddp asks first (a server-side dry run of the launcher's and a
    worker's pod) and fails the job with the server's words, creating no MPIJob."""
    level = {"pod-security.kubernetes.io/enforce": "restricted"}
    cluster.core.patch_namespace(jobs.namespace, {"metadata": {"labels": level}})
    gaudi_mpi = {"nodes": 2, "launcher": "mpi", "accelerator": {"type": "gaudi", "perNode": 8}}
    jobs.create(job_manifest("hpu-mpi", **gaudi_mpi))
    failed = failed_condition(jobs, "hpu-mpi")
    assert failed["reason"] == "PodSecurityViolation"
    assert 'violates PodSecurity "restricted:latest"' in failed["message"]
    assert "hostIPC" in failed["message"], failed
    mpijobs = cluster.custom_objects.list_namespaced_custom_object(
        "kubeflow.org", "v2beta1", jobs.namespace, "mpijobs"
    )["items"]
    assert mpijobs == []


@pytest.fixture
def deny_without_priority_class(cluster: Cluster, jobs: Jobs) -> Iterator[str]:
    """A ValidatingAdmissionPolicy (CEL, no webhook server) that refuses pods with no
    priorityClassName in the test's namespace; its message."""
    name = f"kubeddp-test-{uuid.uuid4().hex[:6]}"
    message = "every pod in this namespace needs a priorityClassName"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "validations": [
                {"expression": "has(object.spec.priorityClassName)", "message": message}
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": jobs.namespace}
                }
            },
        },
    }
    registration = kubernetes.client.AdmissionregistrationV1Api(cluster.api)
    registration.create_validating_admission_policy(policy)
    registration.create_validating_admission_policy_binding(binding)
    probe = {
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/probe"}]},
    }

    def refused() -> bool:
        try:
            cluster.core.create_namespaced_pod(jobs.namespace, probe, dry_run="All")
        except kubernetes.client.ApiException as error:
            return message in str(error.body)
        return False

    try:
        wait_for(refused, "the policy to be in force", timeout=30)
        yield message
    finally:
        registration.delete_validating_admission_policy_binding(name)
        registration.delete_validating_admission_policy(name)


def test_a_job_an_admission_policy_denies_fails_with_its_message(
    jobs: Jobs, operator: OperatorProcess, deny_without_priority_class: str
) -> None:
    jobs.create(job_manifest("bar", **GPU_2X8))
    failed = failed_condition(jobs, "bar")
    assert failed["reason"] == "AdmissionDenied"
    assert deny_without_priority_class in failed["message"]
    assert "ValidatingAdmissionPolicy" in failed["message"]
    wait_for(lambda: not jobs.pods("bar"), "no pod of the denied job left")


def set_gpu_quota(cluster: Cluster, namespace: str, gpus: int) -> None:
    quota = {
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
    }
    try:
        cluster.core.create_namespaced_resource_quota(namespace, quota)
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
        cluster.core.patch_namespaced_resource_quota("gpus", namespace, quota)
    wait_for(
        lambda: (
            (q := cluster.core.read_namespaced_resource_quota("gpus", namespace)).status.hard
            and q.status.hard.get("requests.nvidia.com/gpu") == str(gpus)
        ),
        f"the quota of {gpus} GPUs to be counted",
    )


def test_a_job_a_full_quota_refuses_waits_alone_by_none_and_starts_when_room_frees(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """The quota fits one of the two 8-GPU workers: the job waits and says so, no worker is
    kept (on a GPU cluster it would hold 8 GPUs for a rank 0 that cannot come), and once the
    quota is raised the group starts, no restart counted."""
    set_gpu_quota(cluster, jobs.namespace, 8)
    jobs.create(job_manifest("bar", **GPU_2X8))

    def waiting() -> dict[str, str] | None:
        conditions = jobs.status("bar").get("conditions", [])
        created = [c for c in conditions if c["type"] == "Created"]
        return created[0] if created and created[0]["reason"] == "QuotaExceeded" else None

    created = wait_for(waiting, "the job to say it waits for quota")
    assert created["status"] == "False"
    assert "exceeded quota: gpus" in created["message"] and "\n" not in created["message"]
    assert jobs.status("bar")["phase"] == "Pending"
    # Over a few retries, every worker that the quota let in is deleted within seconds.
    first_seen: dict[str, float] = {}
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        alive = {p.metadata.uid for p in jobs.pods("bar") if p.metadata.deletion_timestamp is None}
        now = time.monotonic()
        for uid in alive:
            first_seen.setdefault(uid, now)
        assert all(now - first_seen[uid] < 3 for uid in alive), "a worker was left alone"
        time.sleep(0.2)
    assert jobs.events("bar").count("QuotaExceeded") == 1

    set_gpu_quota(cluster, jobs.namespace, 16)
    status = jobs.wait_phase("bar", "Running", timeout=90)
    assert status.get("restarts", 0) == 0
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Created"]["status"] == "True"
    assert len(jobs.wait_pods("bar", 2)) == 2
