"""The operator against the real control plane: children, status, group restarts, resume.

Worker outcomes are driven by kwok through the `sim.kubeddp.io/exit-code` annotation
(hack/README.md); everything else is the real API server, scheduler and garbage collector.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes

from kube_ddp import names
from tests.cluster.operator_support import (
    Jobs,
    OperatorProcess,
    env_of,
    job_manifest,
    running_operator,
)
from tests.cluster.support import Cluster, wait_for

GPU_2X8 = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}}
# The group path: every pod recreated on a restart (trainer jobs restart in place by default)
RECREATE = {"restartStrategy": "Recreate"}


def test_gpu_job_runs_and_succeeds(cluster: Cluster, jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("bar", **GPU_2X8))
    pods = jobs.wait_pods("bar", 2)
    service = cluster.core.read_namespaced_service("bar", jobs.namespace)
    assert service.spec.cluster_ip == "None"
    assert service.spec.publish_not_ready_addresses is True
    for rank, pod in enumerate(pods):
        assert pod.metadata.name == f"bar-worker-{rank}"
        assert pod.spec.node_name.startswith("gpu-node-")
        assert pod.metadata.owner_references[0].kind == "DDPTrainingJob"
        env = env_of(pod)
        assert env["WORLD_SIZE"] == "16"
        assert env["NODE_RANK"] == str(rank)
        assert env["MASTER_ADDR"] == f"bar-worker-0.bar.{jobs.namespace}.svc"
        assert env["DDP_BACKEND"] == "nccl"
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
    status = jobs.wait_phase("bar", "Running")
    assert status["workers"] == {
        "total": 2,
        "pending": 0,
        "running": 2,
        "succeeded": 0,
        "failed": 0,
    }
    assert status["startTime"]
    assert status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Created": "True",
        "Schedulable": "True",
        "Running": "True",
    }

    jobs.end_worker("bar-worker-0", 0)
    status = jobs.wait_phase("bar", "Succeeded")
    assert status["completionTime"]
    wait_for(
        lambda: [p.metadata.name for p in jobs.pods("bar")] == ["bar-worker-0"],
        "the still-running worker 1 to be removed (cleanPodPolicy Running)",
    )
    jobs.wait_events("bar", "WorkersCreated", "WorkersRunning", "WorkerSucceeded")


def test_gaudi_job(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("hpu", nodes=2, accelerator={"type": "gaudi", "perNode": 8}))
    pods = jobs.wait_pods("hpu", 2)
    for pod in pods:
        assert pod.spec.node_name.startswith("gaudi-node-")
        assert pod.spec.host_ipc is True
        assert pod.spec.containers[0].resources.limits["habana.ai/gaudi"] == "8"
        assert env_of(pod)["DDP_BACKEND"] == "hccl"
    jobs.wait_phase("hpu", "Running")


def test_retryable_exit_restarts_the_group(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("bar", runPolicy=RECREATE, **GPU_2X8))
    first = jobs.wait_pods("bar", 2)
    jobs.wait_phase("bar", "Running")
    jobs.end_worker("bar-worker-1", 137)
    second = jobs.wait_pods("bar", 2, attempt=1)
    assert {p.metadata.uid for p in second}.isdisjoint(p.metadata.uid for p in first)
    assert all(env_of(p)["KUBEDDP_ATTEMPT"] == "1" for p in second)
    status = jobs.wait_phase("bar", "Running")
    assert status["restarts"] == 1
    assert (
        status["failure"]
        == {
            "pod": "bar-worker-1",
            "exitCode": 137,
            "reason": "Error",
            "message": "",
        }
        or status["failure"]["exitCode"] == 137
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Restarting"]["status"] == "False"
    jobs.wait_events("bar", "WorkerFailed")


def test_a_lost_worker_of_a_job_that_restarts_in_place_is_replaced_alone(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    """InPlace (the default): worker 1 fails (137) and is the only pod created again, under
    the same attempt, at once under a name of its own while the failed pod goes; worker 0
    keeps its pod; restarts 1, said as WorkerReplaced. A second loss, worker 1's successor
    deleted, replaced the same way (the first pod has gone by then: the first name again), a
    preemption."""
    jobs.create(job_manifest("bar", **GPU_2X8))
    first = jobs.wait_workers("bar", 2)[0].metadata.uid
    jobs.wait_phase("bar", "Running")
    for losses, lose, successor in (
        (1, lambda pod: jobs.end_worker(pod, 137), "bar-worker-1-r1"),
        (
            2,
            lambda pod: jobs.cluster.core.delete_namespaced_pod(pod, jobs.namespace),
            "bar-worker-1",
        ),
    ):
        before = jobs.wait_workers("bar", 2)[1]
        lose(before.metadata.name)

        def replaced(old: str = before.metadata.uid) -> dict[int, Any] | None:
            workers = jobs.wait_workers("bar", 2, attempt=0)
            return workers if workers[1].metadata.uid != old else None

        workers = wait_for(replaced, f"worker 1 replaced ({losses})", timeout=60)
        assert workers[0].metadata.uid == first
        assert all(env_of(p)["KUBEDDP_ATTEMPT"] == "0" for p in workers.values())
        assert workers[1].spec.hostname == "bar-worker-1"
        assert workers[1].metadata.name == successor
        # The exit is a restart; the delete a preemption, whether the operator saw the pod
        # going while it ran or, kwok removing it at once, only gone.
        status = wait_for(
            lambda n=losses: (
                (s := jobs.status("bar")).get("phase") == "Running"
                and s["restarts"] + s.get("preemptions", 0) == n
                and s.get("replacing") == []
                and s
            ),
            # the job stays Running while worker 1 is replaced: `replacing` empty is the end
            f"the job Running with its replacement done after loss {losses}",
            timeout=60,
        )
        assert status["attempt"] == 0, status
        assert status["failure"]["pod"] == "bar-worker-1"
    events = jobs.wait_events("bar", "WorkerReplaced", "Preempted")
    assert (events.count("WorkerReplaced"), events.count("Preempted")) == (1, 1)
    assert (status["restarts"], status["preemptions"]) == (1, 1)


def test_non_retryable_exit_fails_the_job(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("bar", **GPU_2X8))
    jobs.wait_phase("bar", "Running")
    jobs.end_worker("bar-worker-1", 1)
    status = jobs.wait_phase("bar", "Failed")
    assert status["failure"]["pod"] == "bar-worker-1"
    assert status["failure"]["exitCode"] == 1
    assert status["restarts"] == 0
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "NonRetryableExitCode"
    assert "bar-worker-1 exited with code 1" in failed["message"]
    wait_for(
        lambda: [p.metadata.name for p in jobs.pods("bar")] == ["bar-worker-1"],
        "the running worker 0 to be removed",
    )


def test_exhausted_backoff_limit_fails_the_job(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("bar", runPolicy={"backoffLimit": 1}, **GPU_2X8))
    jobs.wait_phase("bar", "Running")
    jobs.end_worker("bar-worker-0", 137)
    jobs.wait_pods("bar", 2, attempt=1)
    jobs.end_worker("bar-worker-0", 137)
    status = jobs.wait_phase("bar", "Failed")
    assert status["restarts"] == 1
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"


def test_deleted_worker_restarts_the_group(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("bar", runPolicy=RECREATE, **GPU_2X8))
    jobs.wait_phase("bar", "Running")
    cluster.core.delete_namespaced_pod("bar-worker-1", jobs.namespace)
    jobs.wait_pods("bar", 2, attempt=1)
    status = jobs.wait_phase("bar", "Running")
    assert status["restarts"] == 1
    assert status["failure"]["pod"] == "bar-worker-1"
    assert status["failure"]["reason"] == "Deleted"


def test_preempted_groups_resume_without_a_restart(jobs: Jobs, operator: OperatorProcess) -> None:
    """A worker that exits 86 (it saved on SIGTERM): the group is recreated under the same
    attempt, again and again, never counted against backoffLimit 0; the API server keeps the
    preemption fields the status carries."""
    jobs.create(job_manifest("bar", runPolicy={"backoffLimit": 0, **RECREATE}, **GPU_2X8))
    before = {p.metadata.uid for p in jobs.wait_pods("bar", 2)}
    jobs.wait_phase("bar", "Running")
    for preemption in (1, 2):
        jobs.end_worker("bar-worker-1", names.EXIT_PREEMPTED)

        def recreated(seen: set[str] = before) -> set[str] | None:
            uids = {p.metadata.uid for p in jobs.wait_pods("bar", 2, attempt=0)}
            return uids if uids.isdisjoint(seen) else None

        before = wait_for(recreated, f"the group after preemption {preemption}", timeout=60)
        status = jobs.wait_phase("bar", "Running")
        assert (status["restarts"], status["preemptions"]) == (0, preemption), status
    last = status["lastPreemption"]
    assert last["reason"] == "Terminated" and last["message"].startswith("bar-worker-1"), last
    assert "failure" not in status
    jobs.wait_events("bar", "Preempted")


def test_operator_restart_mid_job_duplicates_nothing(
    cluster: Cluster, namespace: str, jobs: Jobs, tmp_path: Path
) -> None:
    with running_operator(cluster, namespace, tmp_path) as first:
        jobs.create(job_manifest("bar", **GPU_2X8))
        before = jobs.wait_pods("bar", 2)
        jobs.wait_phase("bar", "Running")
        first.kill()
    with running_operator(cluster, namespace, tmp_path):
        # the new operator resumes: same pods, no second set, no restart counted
        jobs.end_worker("bar-worker-1", 0)  # a worker may finish early; worker 0 decides
        jobs.end_worker("bar-worker-0", 0)
        status = jobs.wait_phase("bar", "Succeeded")
        assert status["restarts"] == 0
        after = jobs.pods("bar")
        assert [p.metadata.uid for p in after] == [p.metadata.uid for p in before]


def test_unschedulable_job_says_why(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("big", nodes=1, accelerator={"type": "nvidia", "perNode": 9}))

    def not_schedulable() -> dict[str, str] | None:
        conditions = {c["type"]: c for c in jobs.status("big").get("conditions", [])}
        found = conditions.get("Schedulable")
        return found if found and found["status"] == "False" else None

    condition = wait_for(not_schedulable, "Schedulable=False on the job")
    assert condition["reason"] == "Unschedulable"
    assert condition["message"].startswith("big-worker-0: 0/")
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    assert jobs.status("big")["phase"] == "Pending"
    jobs.wait_events("big", "Unschedulable")


def test_deleting_a_job_removes_its_children_without_the_operator(
    cluster: Cluster, namespace: str, jobs: Jobs, tmp_path: Path
) -> None:
    with running_operator(cluster, namespace, tmp_path):
        jobs.create(job_manifest("bar", **GPU_2X8))
        jobs.wait_pods("bar", 2)
    jobs.delete("bar")  # the operator is stopped: no finalizer may hold the job
    # On a control plane started moments ago the garbage collector may not watch the new CRD
    # yet: it rereads the API's resources every 30 s, then follows the owner references.
    wait_for(lambda: not jobs.pods("bar"), "the garbage collector to remove the pods", timeout=90)
    wait_for(
        lambda: not cluster.core.list_namespaced_service(namespace).items,
        "the garbage collector to remove the Service",
    )
    wait_for(
        lambda: not network_policies(cluster, namespace),
        "the garbage collector to remove the NetworkPolicy",
    )


def network_policies(cluster: Cluster, namespace: str) -> dict[str, Any]:
    networking = kubernetes.client.NetworkingV1Api(cluster.api)
    items = networking.list_namespaced_network_policy(namespace).items
    return {p.metadata.name: p for p in items}


def test_each_job_gets_a_network_policy_admitting_only_its_own_pods(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Applied by the real API server before the pods; a job can turn it off or widen it."""
    scraper = {"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]}
    jobs.create(job_manifest("bar", networkPolicy={"ingress": [scraper]}, **GPU_2X8))
    jobs.create(job_manifest("open", networkPolicy={"enabled": False}, nodes=1))
    jobs.wait_pods("bar", 2)
    jobs.wait_pods("open", 1)
    (policy,) = network_policies(cluster, jobs.namespace).values()  # none for "open"
    assert policy.metadata.name == "bar"
    assert policy.metadata.owner_references[0].kind == "DDPTrainingJob"
    # managed-by, which only the operator's account may put on a pod (pod_policy)
    own = {names.LABEL_JOB_NAME: "bar", names.LABEL_MANAGED_BY: names.MANAGED_BY}
    assert policy.spec.pod_selector.match_labels == own
    assert policy.spec.policy_types == ["Ingress"]  # egress: DNS, the API server, untouched
    first, widened = policy.spec.ingress
    assert first.ports is None and first._from[0].pod_selector.match_labels == own
    assert widened._from[0].namespace_selector.match_labels == {"team": "monitoring"}
    for pod in jobs.pods("bar"):
        assert own.items() <= pod.metadata.labels.items()


def test_spec_the_api_server_refuses_in_a_pod_fails_the_job(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    """Tolerations are free-form in the schema: a bad operator passes the CRD but not pod
    validation. That job is Failed with the API server's words; the others go on."""
    template = {"tolerations": [{"key": "x", "operator": "Sometimes"}]}
    jobs.create(job_manifest("bad", nodes=1, template=template))
    status = jobs.wait_phase("bad", "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "operator" in failed["message"] and "Sometimes" in failed["message"]
    assert not jobs.pods("bad")
    jobs.create(job_manifest("good", nodes=1))
    jobs.wait_phase("good", "Running")


def test_a_pasted_torchrun_line_fails_the_job_with_the_line_to_write(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    """The API server takes any command; the operator refuses one whose torchrun flags fight
    the job's rendezvous before it creates anything, saying what to write."""
    command = ["torchrun", "--nnodes=2", "--rdzv_endpoint=$HOSTNAME:3000", "main.py"]
    jobs.create(job_manifest("pasted", nodes=2, command=command))
    status = jobs.wait_phase("pasted", "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert (
        'write command: ["python", "main.py"] (no args) and set spec.nodes: 2' in failed["message"]
    )
    assert not jobs.pods("pasted")


def test_mpi_launcher_without_the_mpi_operator_waits_then_goes_on(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess, mpijob_crd: ModuleType
) -> None:
    """Without the MPIJob kind the job waits, saying what to install; once the kind is served
    (the CRD applied after kube-ddp started, found when the job looks again) the same job gets its
    MPIJob, with no restart of kube-ddp."""
    gaudi = {"type": "gaudi", "perNode": 8}
    mpioperator = mpijob_crd
    assert not mpioperator.crd_installed(cluster.kubeconfig)
    jobs.create(job_manifest("hccl", nodes=2, launcher="mpi", accelerator=gaudi))
    status = jobs.wait_phase("hccl", "Pending")
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "KindNotServed")
    assert "needs the MPI Operator" in created["message"]
    assert "the job waits until it does" in created["message"]
    assert "KindNotServed" in jobs.wait_events("hccl", "KindNotServed")
    mpioperator.install_crd(cluster.kubeconfig)
    try:

        def mpijob_made() -> bool:
            mpijobs = jobs.cluster.custom_objects.list_namespaced_custom_object(
                "kubeflow.org", "v2beta1", jobs.namespace, names.MPIJOB_PLURAL
            )
            return [m["metadata"]["name"] for m in mpijobs["items"]] == ["hccl"]

        # the job looks again within 30 s
        wait_for(mpijob_made, "the waiting job's MPIJob once the kind is served", timeout=60)
        assert jobs.status("hccl")["phase"] != "Failed"
    finally:
        mpioperator.remove_crd(cluster.kubeconfig)
