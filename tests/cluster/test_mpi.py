"""`launcher: mpi` through the real Kubeflow MPI Operator (v0.8.2, built from its module) on the
local control plane: kube-ddp creates the MPIJob, the MPI Operator creates the launcher and the
workers on kwok nodes, and kube-ddp mirrors what happens into the job's status. kwok plays the
kubelet: a pod "exits" with the code of its `sim.kubeddp.io/exit-code` annotation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from kube_ddp import names
from tests.cluster.operator_support import Jobs, OperatorProcess, job_manifest
from tests.cluster.support import Cluster, wait_for

pytestmark = pytest.mark.usefixtures("mpi_operator")
REPO = Path(__file__).resolve().parents[2]
CPU_MPI = {
    "nodes": 2,
    "launcher": "mpi",
    "mpi": {"socketsPerNode": 1, "coresPerProcess": 1},
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
}


def mpijob(jobs: Jobs, name: str) -> dict[str, Any] | None:
    items = jobs.cluster.custom_objects.list_namespaced_custom_object(
        "kubeflow.org", "v2beta1", jobs.namespace, names.MPIJOB_PLURAL
    )["items"]
    return next((m for m in items if m["metadata"]["name"] == name), None)


def role_pods(jobs: Jobs, job: str, role: str, attempt: int = 0) -> list[Any]:
    return [
        p
        for p in jobs.pods(job)
        if p.metadata.labels.get(names.MPI_LABEL_ROLE) == role
        and p.metadata.labels.get(names.LABEL_ATTEMPT) == str(attempt)
        and p.metadata.deletion_timestamp is None
    ]


def running_launcher(jobs: Jobs, job: str, attempt: int = 0) -> Any:
    return wait_for(
        lambda: next(
            (p for p in role_pods(jobs, job, "launcher", attempt) if p.status.phase == "Running"),
            None,
        ),
        f"a running launcher of {job} (attempt {attempt})",
    )


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_mpi_job_runs_and_succeeds_when_mpirun_exits_0(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("pi", **CPU_MPI))
    status = jobs.wait_phase("pi", "Running")
    assert condition(status, "Running")["reason"] == "LauncherRunning"
    assert status["workers"] == {
        "total": 2,
        "pending": 0,
        "running": 2,
        "succeeded": 0,
        "failed": 0,
    }
    # the MPI Operator's pods are not taken for kube-ddp's own workers: none of those exist
    pods = jobs.pods("pi")
    assert {p.metadata.labels[names.MPI_LABEL_ROLE] for p in pods} == {"launcher", "worker"}
    assert not any(names.LABEL_MANAGED_BY in p.metadata.labels for p in pods)
    launcher = running_launcher(jobs, "pi")

    jobs.end_worker(launcher.metadata.name, 0)
    status = jobs.wait_phase("pi", "Succeeded")
    succeeded = condition(status, "Succeeded")
    assert succeeded["reason"] == "LauncherSucceeded"
    assert launcher.metadata.name in succeeded["message"]
    assert status["completionTime"] >= status["startTime"]
    assert status["restarts"] == 0
    # no template field draws the MPI Operator's warnings (restartPolicy in a template did)
    events = jobs.cluster.core.list_namespaced_event(jobs.namespace).items
    assert not [
        e.reason for e in events if e.type == "Warning" and e.involved_object.kind == "MPIJob"
    ]


def test_mpirun_failing_fails_the_job_with_its_exit_code(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("bad", **CPU_MPI))
    jobs.wait_phase("bad", "Running")
    launcher = running_launcher(jobs, "bad")
    jobs.end_worker(launcher.metadata.name, 3)  # the trainer raised: not retryable
    status = jobs.wait_phase("bad", "Failed")
    assert status["failure"]["pod"] == launcher.metadata.name
    assert status["failure"]["exitCode"] == 3
    assert condition(status, "Failed")["reason"] == "NonRetryableExitCode"
    assert status["restarts"] == 0
    jobs.wait_events("bad", "NonRetryableExitCode")


def test_a_lost_worker_restarts_the_whole_mpijob(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("lost", **CPU_MPI, runPolicy={"backoffLimit": 2}))
    jobs.wait_phase("lost", "Running")
    first = mpijob(jobs, "lost")
    assert first is not None
    worker = role_pods(jobs, "lost", "worker")[1]
    # Evicted, as the kubelet's eviction manager leaves it (kwok leaves Failed pods alone)
    jobs.cluster.core.patch_namespaced_pod_status(
        worker.metadata.name,
        jobs.namespace,
        {"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}},
    )
    status = wait_for(
        lambda: (s := jobs.status("lost")).get("restarts") == 1 and s, "a group restart"
    )
    assert status["failure"]["pod"] == worker.metadata.name
    assert status["failure"]["reason"] == "Evicted"
    # a new MPIJob for attempt 1, after the first (and its pods) went
    second = wait_for(
        lambda: (
            (m := mpijob(jobs, "lost")) and m["metadata"]["uid"] != first["metadata"]["uid"] and m
        ),
        "the next attempt's MPIJob",
        timeout=60,
    )
    assert second["metadata"]["labels"][names.LABEL_ATTEMPT] == "1"
    status = jobs.wait_phase("lost", "Running", timeout=60)
    assert condition(status, "Restarting")["status"] == "False"
    jobs.end_worker(running_launcher(jobs, "lost", attempt=1).metadata.name, 0)
    status = jobs.wait_phase("lost", "Succeeded")
    assert status["restarts"] == 1


def test_a_killed_rank_restarts_until_the_backoff_limit(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("flaky", **CPU_MPI, runPolicy={"backoffLimit": 1}))
    jobs.wait_phase("flaky", "Running")
    jobs.end_worker(running_launcher(jobs, "flaky").metadata.name, 137)
    wait_for(lambda: jobs.status("flaky").get("restarts") == 1, "the first restart")
    jobs.wait_phase("flaky", "Running", timeout=60)
    launcher = running_launcher(jobs, "flaky", attempt=1)
    jobs.end_worker(launcher.metadata.name, 137)
    status = jobs.wait_phase("flaky", "Failed")
    assert condition(status, "Failed")["reason"] == "BackoffLimitExceeded"
    assert (status["failure"]["pod"], status["failure"]["exitCode"]) == (
        launcher.metadata.name,
        137,
    )


def test_suspend_and_resume_go_through_the_mpijob(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("held", **CPU_MPI, runPolicy={"suspend": True}))
    status = jobs.wait_phase("held", "Suspended")
    assert "startTime" not in status
    held = wait_for(lambda: mpijob(jobs, "held"), "the MPIJob")
    assert held["spec"]["runPolicy"]["suspend"] is True
    assert not jobs.pods("held")

    patch = {"spec": {"runPolicy": {"suspend": False}}}
    jobs.cluster.custom_objects.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, jobs.namespace, names.PLURAL, "held", patch
    )
    status = jobs.wait_phase("held", "Running")
    assert condition(status, "Suspended")["status"] == "False"
    assert status["restarts"] == 0

    jobs.cluster.custom_objects.patch_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        jobs.namespace,
        names.PLURAL,
        "held",
        {"spec": {"runPolicy": {"suspend": True}}},
    )
    jobs.wait_phase("held", "Suspended")
    wait_for(lambda: not jobs.pods("held"), "the MPI Operator to remove the pods")
    assert jobs.status("held")["restarts"] == 0


def test_the_gaudi_example_runs_on_the_fake_gaudi_nodes(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """manifests/examples/gaudi-mpi.yaml as a user applies it: 2 nodes x 8 HPUs, mpirun through
    an MPIJob, its dataset on a PersistentVolumeClaim."""
    example = yaml.safe_load((REPO / "manifests/examples/gaudi-mpi.yaml").read_text())
    name = example["metadata"]["name"]
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"cifar10-{jobs.namespace}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadOnlyMany"],
            "hostPath": {"path": "/data/cifar10"},
            "claimRef": {"namespace": jobs.namespace, "name": "cifar10"},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "cifar10"},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
            "volumeName": volume["metadata"]["name"],
        },
    }
    cluster.core.create_persistent_volume(volume)
    try:
        cluster.core.create_namespaced_persistent_volume_claim(jobs.namespace, claim)
        jobs.create(example)
        status = jobs.wait_phase(name, "Running", timeout=60)
        workers = role_pods(jobs, name, "worker")
        assert sorted(p.spec.node_name for p in workers) == ["gaudi-node-0", "gaudi-node-1"]
        (container,) = workers[0].spec.containers
        assert container.resources.limits["habana.ai/gaudi"] == "8"
        assert status["workers"]["running"] == 2
        jobs.end_worker(running_launcher(jobs, name).metadata.name, 0)
        jobs.wait_phase(name, "Succeeded")
    finally:
        cluster.core.delete_persistent_volume(volume["metadata"]["name"])


def test_clean_pod_policy_deadline_and_ttl(jobs: Jobs, operator: OperatorProcess) -> None:
    """cleanPodPolicy is the MPI Operator's (Running: the workers go when mpirun ends, the
    launcher stays for its logs); the deadline and the TTL are kube-ddp's, across attempts."""
    jobs.create(job_manifest("clean", **CPU_MPI, runPolicy={"ttlSecondsAfterFinished": 3}))
    jobs.wait_phase("clean", "Running")
    launcher = running_launcher(jobs, "clean")
    jobs.end_worker(launcher.metadata.name, 0)
    jobs.wait_phase("clean", "Succeeded")
    wait_for(
        lambda: (
            [p.metadata.name for p in jobs.pods("clean") if p.metadata.deletion_timestamp is None]
            == [launcher.metadata.name]
        ),
        "the workers to go and the launcher to stay",
    )
    wait_for(lambda: not mpijob(jobs, "clean"), "the TTL to delete the job and its MPIJob")
    with pytest.raises(kubernetes.client.ApiException) as gone:
        jobs.get("clean")
    assert gone.value.status == 404

    jobs.create(job_manifest("late", **CPU_MPI, runPolicy={"activeDeadlineSeconds": 3}))
    jobs.wait_phase("late", "Running")
    status = jobs.wait_phase("late", "Failed", timeout=30)
    assert condition(status, "Failed")["reason"] == "DeadlineExceeded"
    late = wait_for(lambda: mpijob(jobs, "late"), "the MPIJob")
    assert late["spec"]["runPolicy"]["suspend"] is True  # stopped, kept to be looked at
    wait_for(lambda: not jobs.pods("late"), "the MPI Operator to remove the pods")
