"""Job lifecycle on the real control plane: deadline, TTL, suspend, spec changes, progress
reporting through the job's own ServiceAccount, metrics, and many jobs at once."""

from __future__ import annotations

import contextlib
import functools
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from ddp_trainer.report import StatusReporter, position_fields, training_patch
from kube_ddp import names
from tests.cluster.operator_support import (
    Jobs,
    OperatorProcess,
    job_manifest,
    running_operator,
    service_account_token,
)
from tests.cluster.support import Cluster, load_dev_cluster, wait_for

CPU_2 = {"nodes": 2}


def patch_spec(cluster: Cluster, jobs: Jobs, name: str, spec: dict[str, Any]) -> None:
    cluster.custom_objects.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, jobs.namespace, names.PLURAL, name, {"spec": spec}
    )


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return dict(next(c for c in status["conditions"] if c["type"] == type_))


def test_active_deadline_fails_the_job_and_removes_its_pods(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("late", runPolicy={"activeDeadlineSeconds": 3}, **CPU_2))
    jobs.wait_phase("late", "Running")
    status = jobs.wait_phase("late", "Failed", timeout=20)
    assert condition(status, "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: not jobs.pods("late"), "the pods to be removed past the deadline")


def test_ttl_deletes_a_finished_job_and_its_children(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("brief", runPolicy={"ttlSecondsAfterFinished": 2}, **CPU_2))
    jobs.wait_pods("brief", 2)
    jobs.end_worker("brief-worker-0", 0)
    jobs.wait_phase("brief", "Succeeded")

    def gone() -> bool:
        try:
            jobs.get("brief")
        except kubernetes.client.ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, "the job to be deleted after its TTL", timeout=20)
    # The garbage collector watches a kind from its discovery sync after the CRD came (every
    # 30 s): on a cluster whose CRD is seconds old (this module first on a new one), the pods
    # of a job deleted before then wait for that sync.
    wait_for(lambda: not jobs.pods("brief"), "its pods to be garbage-collected", timeout=75)


def test_suspend_and_resume(cluster: Cluster, jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(job_manifest("queued", runPolicy={"suspend": True}, **CPU_2))
    status = jobs.wait_phase("queued", "Suspended")
    assert condition(status, "Suspended")["status"] == "True"
    assert not jobs.pods("queued")  # created suspended: nothing at all

    patch_spec(cluster, jobs, "queued", {"runPolicy": {"suspend": False}})
    first = jobs.wait_pods("queued", 2)
    jobs.wait_phase("queued", "Running")

    patch_spec(cluster, jobs, "queued", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("queued", "Suspended")
    wait_for(lambda: not jobs.pods("queued"), "the pods to be removed while suspended")

    patch_spec(cluster, jobs, "queued", {"runPolicy": {"suspend": False}})
    second = jobs.wait_pods("queued", 2)
    status = jobs.wait_phase("queued", "Running")
    assert status["restarts"] == 0
    assert condition(status, "Suspended")["status"] == "False"
    assert {p.metadata.uid for p in first}.isdisjoint(p.metadata.uid for p in second)


def test_a_live_job_keeps_its_shape(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("fixed", **CPU_2))
    jobs.wait_phase("fixed", "Running")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        patch_spec(cluster, jobs, "fixed", {"nodes": 3})
    assert refused.value.status == 422
    assert "spec.nodes cannot change on an existing job" in str(refused.value.body)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        patch_spec(cluster, jobs, "fixed", {"template": {"nodeSelector": {"a": "b"}}})
    assert "only while the job is suspended" in str(refused.value.body)
    patch_spec(cluster, jobs, "fixed", {"runPolicy": {"activeDeadlineSeconds": 3600}})
    assert jobs.get("fixed")["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600


def reporter_env(
    cluster: Cluster, jobs: Jobs, job: str, account: str, token_file: Path
) -> dict[str, str]:
    """What rank 0 of `job` reads to report, with a token of `account`."""
    token_file.write_text(service_account_token(cluster, jobs.namespace, account))
    return {
        "KUBEDDP_JOB_NAME": job,
        "KUBEDDP_JOB_NAMESPACE": jobs.namespace,
        "KUBEDDP_API_SERVER": cluster.server,
        "KUBEDDP_TOKEN_FILE": str(token_file),
        "KUBEDDP_CA_FILE": str(cluster.ca_file),
    }


def epoch_3_report() -> dict[str, Any]:
    return training_patch(
        epoch=3,
        epochs=10,
        loss=0.25,
        val_accuracy=0.9,
        best_val_accuracy=0.91,
        images_per_sec=1234.5,
        now=datetime.now(UTC),
    )


def test_trainer_reports_progress_with_the_jobs_own_account(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess, tmp_path: Path
) -> None:
    jobs.create(job_manifest("mine", **CPU_2))
    jobs.create(job_manifest("theirs", **CPU_2))
    pods = jobs.wait_pods("mine", 2)
    account = pods[0].spec.service_account_name
    assert account == "mine-trainer"
    token_file = tmp_path / "token"
    env = reporter_env(cluster, jobs, "mine", account, token_file)
    reporter = StatusReporter.from_env(env)
    assert reporter is not None
    patch = epoch_3_report()
    assert reporter.report(patch) is True
    training = jobs.status("mine")["training"]
    assert (training["epoch"], training["valAccuracy"], training["imagesPerSec"]) == (
        3,
        0.9,
        1234.5,
    )
    printed = cluster.kubectl("get", "ddpjobs", "mine", "-n", jobs.namespace).stdout
    assert printed.split("\n")[0].split() == [
        "NAME",
        "PHASE",
        "WORKERS",
        "ACCELERATOR",
        "EPOCH",
        "VAL-ACC",
        "PROGRESS",
        "ETA",
        "RESTARTS",
        "AGE",
    ]
    assert printed.split("\n")[1].split()[4:6] == ["3", "0.9"]

    # the same token may not touch another job's status
    other = StatusReporter.from_env({**env, "KUBEDDP_JOB_NAME": "theirs"})
    assert other is not None and other.report(patch) is False
    client = kubernetes.client.CustomObjectsApi(cluster.client_with_token(token_file.read_text()))
    with pytest.raises(kubernetes.client.ApiException) as forbidden:
        client.patch_namespaced_custom_object_status(
            names.GROUP, names.VERSION, jobs.namespace, names.PLURAL, "theirs", patch
        )
    assert forbidden.value.status == 403
    # and the operator's own status writes leave the trainer's report alone
    jobs.end_worker("mine-worker-0", 0)
    assert jobs.wait_phase("mine", "Succeeded")["training"]["epoch"] == 3


def test_the_users_service_account_reports_only_when_the_job_says_so(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess, tmp_path: Path
) -> None:
    """template.serviceAccountName: the workers run as the user's account, which other pods
    may share. Its token may not write the job's status unless template.serviceAccountReports
    binds it (the pods are told not to try); with it, rank 0's report is allowed."""
    cluster.core.create_namespaced_service_account(jobs.namespace, {"metadata": {"name": "mine"}})
    jobs.create(job_manifest("unbound", **CPU_2, template={"serviceAccountName": "mine"}))
    template = {"serviceAccountName": "mine", "serviceAccountReports": True}
    jobs.create(job_manifest("bound", **CPU_2, template=template))
    for job in ("unbound", "bound"):
        pods = jobs.wait_pods(job, 2)
        assert {p.spec.service_account_name for p in pods} == {"mine"}
        told = {e.name: e.value for e in pods[0].spec.containers[0].env}.get("KUBEDDP_REPORT")
        assert told == ("false" if job == "unbound" else None)
        env = reporter_env(cluster, jobs, job, "mine", tmp_path / "token")
        reporter = StatusReporter.from_env(env)
        assert reporter is not None
        assert reporter.report(epoch_3_report()) is (job == "bound")
    assert "training" not in jobs.status("unbound")
    assert jobs.status("bound")["training"]["epoch"] == 3


def test_a_workers_token_cannot_steer_the_job(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """The token every worker pod holds may write the job's whole status: what the operator
    owns, forged with it, is restored and said on the job, and never acted on."""
    jobs.create(job_manifest("steered", **CPU_2))
    first = {p.metadata.uid for p in jobs.wait_pods("steered", 2)}
    jobs.wait_phase("steered", "Running")
    token = service_account_token(cluster, jobs.namespace, "steered-trainer")
    worker = kubernetes.client.CustomObjectsApi(cluster.client_with_token(token))
    patch = functools.partial(
        worker.patch_namespaced_custom_object_status,
        names.GROUP,
        names.VERSION,
        jobs.namespace,
        names.PLURAL,
        "steered",
    )
    # workers past the job's nodes: the CRD's rule refuses them to any writer
    with pytest.raises(kubernetes.client.ApiException) as refused:
        patch({"status": {"replacing": list(range(2, 42))}})
    assert refused.value.status == 422
    patch({"status": {"replacing": [1], "phase": "Succeeded", "restarts": 7}})
    jobs.wait_events("steered", "StatusOverwritten")
    status = jobs.wait_phase("steered", "Running")
    assert (status["restarts"], status.get("replacing", [])) == (0, [])
    # the reconcile that read the forged status acted before it wrote the true one back
    assert {p.metadata.uid for p in jobs.pods("steered")} == first


def scrape(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.status, response.read().decode()


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


def test_metrics_and_liveness(cluster: Cluster, namespace: str, jobs: Jobs, tmp_path: Path) -> None:
    dev_cluster = load_dev_cluster()
    metrics_port, health_port = dev_cluster.free_port(), dev_cluster.free_port()
    args = (f"--metrics-port={metrics_port}", f"--health-port={health_port}")
    with running_operator(cluster, namespace, tmp_path, *args):
        jobs.create(job_manifest("watched", **CPU_2))
        jobs.wait_phase("watched", "Running")
        wait_for(lambda: scrape(health_port, "/healthz")[0] == 200, "the liveness endpoint")
        text = scrape(metrics_port, "/metrics")[1]
        assert metric(text, 'kubeddp_jobs{phase="Running"}') == 1
        assert metric(text, "kubeddp_time_to_running_seconds_count") == 1
        assert metric(text, "kubeddp_group_restarts_total") == 0
        assert metric(text, "kubeddp_jobs_synced_total") == 1  # however often it was reconciled
        jobs.end_worker("watched-worker-1", 137)  # replaced alone: the job restarts in place

        def restarted() -> str | None:
            text = scrape(metrics_port, "/metrics")[1]
            replaced = metric(text, 'kubeddp_restarts_total{kind="Replaced"')
            return text if replaced == 1 else None

        text = wait_for(restarted, "kubeddp_restarts_total to count the replacement")
        assert metric(text, "kubeddp_group_restarts_total") == 0


def test_a_lost_node_restarts_the_group_elsewhere(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Two fake nodes of this test's own; one is deleted under a running job. The pod garbage
    collector removes its pods (40-60 s), and the group restarts on the node left."""
    suffix = jobs.namespace[-6:]
    label = {"kubeddp.io/test-node": suffix}
    node_names = [f"lost-{suffix}-{i}" for i in range(2)]
    for node in node_names:
        cluster.core.create_node(fake_node(node, label))
    try:
        template = {"nodeSelector": label}
        # Recreate: the group goes elsewhere (in place, only the lost node's worker would)
        recreate = {"restartStrategy": "Recreate"}
        jobs.create(job_manifest("roaming", nodes=2, template=template, runPolicy=recreate))
        pods = jobs.wait_pods("roaming", 2)
        doomed = pods[1].spec.node_name
        cluster.core.delete_node(doomed)
        again = jobs.wait_pods("roaming", 2, attempt=1, timeout=120)
        assert {p.spec.node_name for p in again} <= set(node_names) - {doomed}
        status = jobs.wait_phase("roaming", "Running")
        assert status["restarts"] == 1
        lost = {p.metadata.name for p in pods if p.spec.node_name == doomed}
        assert status["failure"]["pod"] in lost
        assert status["failure"]["reason"] in ("DeletionByPodGC", "Deleted")
    finally:
        for node in node_names:
            with contextlib.suppress(kubernetes.client.ApiException):
                cluster.core.delete_node(node)


SILENT_JOBS = 10


def test_a_node_that_stops_reporting_restarts_its_jobs_elsewhere(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """A fake node of this test's own stops reporting under 10 running jobs: kwok stops its
    status and its Lease is held by a holder that never renews it (kwok leaves a Lease alone
    that another holds), and kwok leaves its pods alone (`KUBELET_STOPPED`: it would delete
    them once evicted, by name, and could reach the next attempt's pods of the same names). The
    node controller marks its pods not ready and taints it unreachable, the taint manager evicts
    them (the job's default toleration, runPolicy.unreachableTolerationSeconds), and they
    would stay Terminating, as on a real node: the operator force-deletes them at once, every
    job restarts with NodeLost naming the node, and the next attempt runs on the node left."""
    suffix = jobs.namespace[-6:]
    label = {"kubeddp.io/test-node": suffix}
    silent, spare = f"silent-{suffix}", f"spare-{suffix}"
    cluster.core.create_node(fake_node(silent, label))
    cluster.core.create_node(fake_node(spare, {}))
    template = {"nodeSelector": label}  # tolerations and grace period: the defaults
    job_names = [f"silent-{i}" for i in range(SILENT_JOBS)]
    try:
        for name in job_names:
            jobs.create(job_manifest(name, nodes=2, template=template))
        for name in job_names:
            jobs.wait_pods(name, 2, timeout=60)
        stopped = {"metadata": {"annotations": load_dev_cluster().controlplane.KUBELET_STOPPED}}
        on_silent = f"spec.nodeName={silent}"
        for pod in cluster.core.list_namespaced_pod(jobs.namespace, field_selector=on_silent).items:
            cluster.core.patch_namespaced_pod(pod.metadata.name, jobs.namespace, stopped)
        silenced = datetime.now(UTC)
        stop_reporting = {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}}
        cluster.core.patch_node(silent, stop_reporting)
        dead_holder = {
            "spec": {
                "holderIdentity": "a-kubelet-that-stopped",
                "leaseDurationSeconds": 3600,
                "renewTime": silenced.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
            }
        }
        coordination = kubernetes.client.CoordinationV1Api(cluster.api)
        coordination.patch_namespaced_lease(silent, "kube-node-lease", dead_holder)
        cluster.core.patch_node(spare, {"metadata": {"labels": label}})
        for name in job_names:
            again = jobs.wait_pods(name, 2, attempt=1, timeout=240)
            assert {p.spec.node_name for p in again} == {spare}
        took = (datetime.now(UTC) - silenced).total_seconds()
        print(f"{SILENT_JOBS} jobs: node silent -> every next attempt running in {took:.0f} s")
        for name in job_names:
            status = jobs.wait_phase(name, "Running")
            assert status["restarts"] == 1
            failure = status["failure"]
            assert failure["reason"] == "NodeLost", failure
            assert failure["message"].startswith(f"node {silent} stopped reporting"), failure
            assert f"{name}-worker-" in failure["pod"]
            restarting = condition(status, "Restarting")
            assert restarting["reason"] == "WorkersRunning"  # cleared once it runs again
        left = cluster.core.list_namespaced_pod(jobs.namespace, field_selector=on_silent).items
        assert left == []
    finally:
        for node in (silent, spare):
            with contextlib.suppress(kubernetes.client.ApiException):
                cluster.core.delete_node(node)


def test_a_node_that_evicted_a_worker_is_avoided_by_the_next_pods(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Two nodes of this test's own; the job's template prefers the first. Its worker there
    is evicted under node pressure (as a kubelet does it: phase Failed, reason Evicted): the
    group restarts, status.avoidedNodes names the node, and the next attempt's pod goes to
    the other node, against the template's own preference."""
    suffix = jobs.namespace[-6:]
    label = {"kubeddp.io/test-node": suffix}
    pressed, other = f"pressed-{suffix}", f"other-{suffix}"
    for node in (pressed, other):
        cluster.core.create_node(fake_node(node, label))
    prefer_pressed = {
        "weight": 10,
        "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": [pressed]}]
        },
    }
    template = {
        "nodeSelector": label,
        "affinity": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [prefer_pressed]}
        },
        "terminationGracePeriodSeconds": 1,
    }
    try:
        jobs.create(job_manifest("pressed", nodes=1, template=template))
        (first,) = jobs.wait_pods("pressed", 1, timeout=60)
        assert first.spec.node_name == pressed
        stopped = {"metadata": {"annotations": load_dev_cluster().controlplane.KUBELET_STOPPED}}
        cluster.core.patch_namespaced_pod(first.metadata.name, jobs.namespace, stopped)
        evicted = {
            "status": {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
            }
        }
        cluster.core.patch_namespaced_pod_status(first.metadata.name, jobs.namespace, evicted)
        (again,) = jobs.wait_pods("pressed", 1, attempt=1, timeout=120)
        assert again.spec.node_name == other
        status = jobs.status("pressed")
        assert [(a["node"], a["reason"]) for a in status["avoidedNodes"]] == [(pressed, "Evicted")]
        assert status["failure"]["node"] == pressed
        said = [
            e.message
            for e in cluster.core.list_namespaced_event(
                jobs.namespace, field_selector="involvedObject.name=pressed"
            ).items
            if e.reason == "WorkerFailed"
        ]
        assert any(f"prefer nodes other than {pressed} for 10 min" in m for m in said), said
    finally:
        for node in (pressed, other):
            with contextlib.suppress(kubernetes.client.ApiException):
                cluster.core.delete_node(node)


STALLING_JOBS = 4
PROGRESS_DEADLINE = 60  # the least runPolicy.progressDeadlineSeconds takes


def report_step(jobs: Jobs, name: str, step: int) -> None:
    """What rank 0's heartbeat PATCHes: where training stands, stamped now."""
    patch = epoch_3_report()
    training = patch["status"]["training"]
    position = position_fields(
        epoch=3, epochs=10, step=step, steps_per_epoch=100, remaining_seconds=600
    )
    training.update(position)
    jobs.report_training(name, training)


def test_jobs_whose_rank_0_goes_quiet_restart_at_their_progress_deadline(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Eight running jobs with progressDeadlineSeconds; the test plays each one's rank 0. Four
    keep their heartbeat (every 10 s), four report once and go quiet: those four, and only
    those, restart their group with ProgressDeadlineExceeded saying where they stopped."""
    quiet = [f"quiet-{i}" for i in range(STALLING_JOBS)]
    beating = [f"beating-{i}" for i in range(STALLING_JOBS)]
    run_policy = {"progressDeadlineSeconds": PROGRESS_DEADLINE}
    for name in quiet + beating:
        jobs.create(job_manifest(name, nodes=2, runPolicy=run_policy))
    for name in quiet + beating:
        jobs.wait_pods(name, 2, timeout=60)
    for name in quiet + beating:
        report_step(jobs, name, step=14)
    reported = time.monotonic()
    step = 14

    def restarted() -> bool:
        return all(jobs.status(name).get("restarts", 0) >= 1 for name in quiet)

    while not restarted():
        assert time.monotonic() - reported < PROGRESS_DEADLINE + 60, [
            jobs.status(name).get("restarts") for name in quiet
        ]
        time.sleep(10)
        step += 1
        for name in beating:
            report_step(jobs, name, step)
    took = time.monotonic() - reported
    print(f"{STALLING_JOBS} quiet jobs restarted {took:.0f} s after their last report")
    assert took >= PROGRESS_DEADLINE
    for name in quiet:
        failure = jobs.status(name)["failure"]
        assert failure["reason"] == "ProgressDeadlineExceeded", failure
        assert "(epoch 4, step 14 of 100)" in failure["message"], failure
        assert f"progressDeadlineSeconds ({PROGRESS_DEADLINE}s)" in failure["message"]
    for name in beating:
        assert jobs.status(name).get("restarts", 0) == 0, jobs.status(name).get("failure")


def test_a_hang_names_the_rank_rank_0_found_and_a_job_without_a_deadline_learns_one(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """The test plays rank 0 of two jobs that go quiet. One sets progressDeadlineSeconds and
    says, as rank 0's ledger thread does, that the group waits on worker 1: its failure names
    worker 1, its node and rank. The other sets none and said its longest gap between reports
    (5 s, once an epoch ended): it restarts at the learned deadline, 120 s, the minimum."""
    jobs.create(job_manifest("named", nodes=2, runPolicy={"progressDeadlineSeconds": 60}))
    jobs.create(job_manifest("learned", nodes=2))
    for name in ("named", "learned"):
        jobs.wait_pods(name, 2, timeout=60)
        report_step(jobs, name, step=14)
    jobs.report_training("learned", {"longestReportGapSeconds": 5.0})
    worker_1 = next(p for p in jobs.pods("named") if p.metadata.name.endswith("-worker-1"))
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    said = (
        f"rank 1 (pod named-worker-1, node {worker_1.spec.node_name}) stopped first, at step "
        "13: 1 collective(s) behind the others"
    )
    found = {
        "rank": 1,
        "pod": "named-worker-1",
        "node": worker_1.spec.node_name,
        "step": 13,
        "message": said,
        "checkedAt": stamp,
    }
    jobs.report_training("named", {"stall": found})
    quiet = time.monotonic()
    wait_for(lambda: jobs.status("named").get("restarts", 0) >= 1, "named to restart", 120)
    failure = jobs.status("named")["failure"]
    assert (failure["pod"], failure["node"], failure["rank"]) == (
        "named-worker-1",
        worker_1.spec.node_name,
        1,
    ), failure
    assert failure["message"].startswith(f"{said} (found by rank 0); rank 0 last reported")
    assert jobs.status("learned").get("restarts", 0) == 0
    wait_for(lambda: jobs.status("learned").get("restarts", 0) >= 1, "learned to restart", 180)
    took = time.monotonic() - quiet
    print(f"learned deadline: restart {took:.0f} s after the last report")
    assert took >= 120
    failure = jobs.status("learned")["failure"]
    assert "the learned progress deadline (120s: 5 x the longest gap" in failure["message"]


def fake_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A node kwok plays the kubelet for (see hack/nodes.yaml)."""
    capacity = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"type": "kwok", **labels},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def test_a_hundred_jobs_at_once_all_end_right(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    """Outcomes set at creation through the pod annotation kwok obeys: success, a hard
    failure, and a retryable failure that exhausts backoffLimit 1 after one restart."""
    plans = {"ok": (0, "Succeeded", 0), "bad": (1, "Failed", 0), "oom": (137, "Failed", 1)}
    expected: dict[str, tuple[str, int]] = {}
    for i in range(100):
        kind = ("ok", "bad", "oom")[i % 3]
        exit_code, phase, restarts = plans[kind]
        name = f"{kind}-{i}"
        annotations = {"sim.kubeddp.io/exit-code": str(exit_code)}
        jobs.create(
            job_manifest(
                name, nodes=1, template={"annotations": annotations}, runPolicy={"backoffLimit": 1}
            )
        )
        expected[name] = (phase, restarts)

    def all_final() -> dict[str, tuple[str, int]] | None:
        listed = cluster.custom_objects.list_namespaced_custom_object(
            names.GROUP, names.VERSION, jobs.namespace, names.PLURAL
        )["items"]
        seen = {
            j["metadata"]["name"]: (
                j.get("status", {}).get("phase"),
                j.get("status", {}).get("restarts", 0),
            )
            for j in listed
        }
        return seen if seen == expected else None

    wait_for(all_final, "all 100 jobs to reach their final phase", timeout=120)
    pods = cluster.core.list_namespaced_pod(jobs.namespace).items
    owners = Counter(p.metadata.owner_references[0].name for p in pods)
    assert set(owners) <= set(expected)  # no orphans
    for pod in pods:
        job = pod.metadata.owner_references[0].name
        assert int(pod.metadata.labels[names.LABEL_ATTEMPT]) == expected[job][1]
    assert all(count == 1 for count in owners.values())  # no duplicates


def test_the_operator_survives_an_api_server_restart(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("before", nodes=1))
    jobs.wait_phase("before", "Running")
    load_dev_cluster().restart_apiserver()
    jobs.create(job_manifest("after", nodes=1))
    jobs.wait_pods("after", 1, timeout=60)
    jobs.wait_phase("after", "Running")
    jobs.end_worker("before-worker-0", 0)
    jobs.wait_phase("before", "Succeeded")
