"""Jobs as a user runs them, end to end, on a real node: the operator in the cluster (its chart,
its ServiceAccount), real pods that train across each other through the headless Service's
DNS names, real exit codes, OOM kills, logs and garbage collection.

Each test asserts on what a user sees: `kubectl get ddpjobs`, the job's status, its Events and
its pods' logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from ddp_trainer import contract
from kube_ddp import names
from kube_ddp.reasons import Reason
from tests.cluster.operator_support import Jobs, job_manifest
from tests.cluster.support import REPO, wait_for
from tests.cpu_quota import cpu_quota
from tests.e2e.conftest import OPERATOR_NAMESPACE, RELEASE
from tests.e2e.platform import DevPlatform, Platform, container_pid

# Small, real training: scikit-learn's bundled digits (no download), two CPU workers (gloo).
DIGITS = {"dataset": "digits", "batchSize": 32, "device": "cpu", "timeoutSeconds": 120}
TRAINING_TIMEOUT = 240  # seconds: import torch, train, on 2 shared cores


# The group path: every pod recreated on a restart (trainer jobs restart in place by default)
RECREATE = {"restartStrategy": "Recreate"}


def cpu_job(platform: Platform, name: str, **spec: Any) -> dict[str, Any]:
    return job_manifest(name, **platform.job_spec({"nodes": 2, **spec}))


def logs(jobs: Jobs, pod: str) -> str:
    return str(jobs.cluster.core.read_namespaced_pod_log(pod, jobs.namespace))


def kubectl_get_ddpjobs(jobs: Jobs) -> str:
    return jobs.cluster.kubectl("get", "ddpjobs", "-n", jobs.namespace).stdout


class Watcher:
    """Polls `kubectl get ddpjobs` in the background while a job runs: what a user watches."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.rows: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            self.rows += kubectl_get_ddpjobs(self.jobs).splitlines()[1:]

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def test_the_operator_runs_in_the_cluster(platform: Platform, operator: dict[str, Any]) -> None:
    """Scenario 1: installed by the chart, a pod of its Deployment, with the chart's
    ServiceAccount; /healthz and /metrics answer (through the API server's pod proxy)."""
    core = platform.cluster.core
    pods = core.list_namespaced_pod(
        OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/name=kube-ddp"
    ).items
    running = [p for p in pods if p.status.phase == "Running"]
    assert running, [p.status.phase for p in pods]
    pod = running[0]
    assert pod.spec.service_account_name == RELEASE
    assert pod.metadata.owner_references[0].kind == "ReplicaSet"

    def proxied(port: int, path: str) -> str:
        return str(
            platform.cluster.kubectl(
                "get",
                "--raw",
                f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/"
                f"{pod.metadata.name}:{port}/proxy{path}",
            ).stdout
        )

    assert proxied(8080, "/healthz")
    assert "kubeddp_jobs" in proxied(8081, "/metrics")


def test_two_workers_train_to_the_target(platform: Platform, jobs: Jobs) -> None:
    """Scenario 2: two pods train together, stop early at the target, Succeeded; rank 0 wrote
    status.training with its own token, and `kubectl get ddpjobs` showed it while running."""
    trainer = {**DIGITS, "model": "mlp", "epochs": 40, "targetAccuracy": 0.9, "patience": 2}
    with Watcher(jobs) as watcher:
        jobs.create(cpu_job(platform, "digits", trainer=trainer))
        status = jobs.wait_phase("digits", "Succeeded", timeout=TRAINING_TIMEOUT)
    training = status["training"]
    assert training["valAccuracy"] >= 0.9
    assert 1 <= training["epoch"] < 40  # stopped early
    assert training["imagesPerSec"] > 0
    assert status["restarts"] == 0
    seen = [row.split() for row in watcher.rows]
    # NAME PHASE WORKERS ACCELERATOR EPOCH VAL-ACC RESTARTS AGE: progress while Running
    assert any(row[1] == "Running" and row[4].isdigit() for row in seen), watcher.rows
    worker0 = logs(jobs, "digits-worker-0")
    assert "world_size=2" in worker0 and "backend=gloo" in worker0
    # The two ranks met at worker 0's DNS name, through the headless Service.
    pod = jobs.cluster.core.read_namespaced_pod("digits-worker-0", jobs.namespace)
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["MASTER_ADDR"] == names.master_addr("digits", jobs.namespace)


def test_a_job_trains_in_a_namespace_that_enforces_restricted(
    platform: Platform, jobs: Jobs
) -> None:
    """Issue 28: the API server's PodSecurity admission enforces `restricted` in the job's
    namespace; kube-ddp's pods pass it as they are (non-root: the kubelet checks runAsNonRoot
    against the image's user) and train to Succeeded."""
    trainer = {**DIGITS, "model": "mlp", "epochs": 40, "targetAccuracy": 0.9, "patience": 2}
    with platform.restricted(jobs.namespace) as job_spec:
        jobs.create(job_manifest("hardened", **job_spec({"nodes": 2, "trainer": trainer})))
        status = jobs.wait_phase("hardened", "Succeeded", timeout=TRAINING_TIMEOUT)
    assert status["restarts"] == 0, status.get("failure")
    assert status["training"]["valAccuracy"] >= 0.9
    pod = jobs.cluster.core.read_namespaced_pod("hardened-worker-0", jobs.namespace)
    assert pod.spec.security_context.run_as_non_root is True
    assert "world_size=2" in logs(jobs, "hardened-worker-0")


def checkpointed(platform: Platform, jobs: Jobs, **trainer: Any) -> dict[str, Any]:
    """The spec of an 8-epoch job that checkpoints to a directory on the node, from which a
    group restart resumes."""
    checkpoints = platform.scratch_volume("checkpoints", jobs.namespace)
    options = {**DIGITS, "model": "wide-resnet", "wrnDepth": 10, "wrnWidth": 1, "epochs": 8}
    return {
        "trainer": {**options, "checkpointDir": "/checkpoints", **trainer},
        "template": {
            "volumes": [checkpoints],
            "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}],
        },
    }


def wait_for_two_epochs(jobs: Jobs, name: str) -> None:
    wait_for(
        lambda: (jobs.status(name).get("training") or {}).get("epoch", 0) >= 2,
        "two epochs (and their checkpoints)",
        timeout=TRAINING_TIMEOUT,
        interval=0.5,
    )


def test_a_killed_rank_restarts_the_group_which_resumes(platform: Platform, jobs: Jobs) -> None:
    """Scenario 3: a worker's trainer is SIGKILLed mid-training: exit 137, one group restart
    (restartStrategy Recreate), and the new attempt resumes from the checkpoint the first one
    wrote."""
    spec = {**checkpointed(platform, jobs), "runPolicy": RECREATE}
    jobs.create(cpu_job(platform, "resume", **spec))
    wait_for_two_epochs(jobs, "resume")
    victim = jobs.cluster.core.read_namespaced_pod("resume-worker-1", jobs.namespace)
    platform.kill(victim)
    status = jobs.wait_phase("resume", "Succeeded", timeout=TRAINING_TIMEOUT)
    assert status["restarts"] == 1
    failure = status["failure"]
    assert (failure["pod"], failure["exitCode"]) == ("resume-worker-1", 137)
    assert "resuming at step" in logs(jobs, "resume-worker-0")
    jobs.wait_events("resume", Reason.WORKER_FAILED)


PROGRESS_DEADLINE = 60  # seconds: two of the trainer's 30 s heartbeats


def wait_restarted(jobs: Jobs, name: str, since: float, timeout: float) -> float:
    """Seconds from `since` (time.monotonic) until the job's first group restart."""
    wait_for(
        lambda: jobs.status(name).get("restarts", 0) >= 1,
        f"{name} to restart its group",
        timeout=timeout,
        interval=0.5,
    )
    return time.monotonic() - since


def test_a_hung_rank_restarts_the_group_at_the_progress_deadline(
    platform: Platform, jobs: Jobs
) -> None:
    """Worker-1's trainer stops (SIGSTOP from the node: a hang, as a deadlock or a stuck
    collective is), so rank 0 blocks in its next collective and reports no progress; at
    progressDeadlineSeconds the group restarts (ProgressDeadlineExceeded, not the user's bug),
    naming worker 1, its node and rank, resumes from the checkpoint and succeeds. The
    collective's own timeout (600 s) is far beyond the deadline: the deadline ends the hang."""
    spec = checkpointed(platform, jobs, timeoutSeconds=600)
    # Recreate: the stopped process is the pod's own (no agent in front of the trainer)
    spec["runPolicy"] = {"progressDeadlineSeconds": PROGRESS_DEADLINE, **RECREATE}
    jobs.create(cpu_job(platform, "hang", **spec))
    wait_for_two_epochs(jobs, "hang")
    victim = jobs.cluster.core.read_namespaced_pod("hang-worker-1", jobs.namespace)
    platform.kill(victim, signal.SIGSTOP)
    hung = time.monotonic()
    took = wait_restarted(jobs, "hang", hung, timeout=PROGRESS_DEADLINE + 90)
    print(f"hang -> group restart: {took:.1f} s (progressDeadlineSeconds {PROGRESS_DEADLINE})")
    status = jobs.wait_phase("hang", "Succeeded", timeout=TRAINING_TIMEOUT + 60)
    assert status["restarts"] == 1, status.get("failure")
    failure = status["failure"]
    # The rank that hung, found by rank 0's ledger thread while rank 0 waited on it.
    node = victim.spec.node_name
    assert (failure["pod"], failure["node"], failure["rank"]) == ("hang-worker-1", node, 1)
    assert failure["reason"] == "ProgressDeadlineExceeded", failure
    assert failure["message"].startswith(
        f"rank 1 (pod hang-worker-1, node {node}) stopped first, at step "
    ), failure
    assert "behind the others" in failure["message"] or "silent for" in failure["message"]
    assert failure["message"].endswith(
        f"more than progressDeadlineSeconds ({PROGRESS_DEADLINE}s) ago"
    ), failure
    jobs.wait_events("hang", Reason.PROGRESS_DEADLINE_EXCEEDED)
    assert "resuming at step" in logs(jobs, "hang-worker-0")
    assert took <= PROGRESS_DEADLINE + 30 + 10  # the last report is at most a heartbeat old


def test_a_rank_slowed_on_its_node_is_named_a_straggler_on_the_job(
    platform: Platform, jobs: Jobs
) -> None:
    """Worker 1's rank is given a fifth of a core (a cgroup's CPU quota, from the node): the
    job's Straggler condition names it, with a Warning Event, and says it no more once the
    quota is lifted."""
    if not isinstance(platform, DevPlatform):
        pytest.skip("the node is this machine on the dev cluster only")
    trainer = {**DIGITS, "model": "wide-resnet", "wrnDepth": 10, "wrnWidth": 1, "epochs": 400}
    heartbeat = [{"name": contract.HEARTBEAT_ENV, "value": "2"}]
    jobs.create(cpu_job(platform, "slow", trainer=trainer, env=heartbeat))
    wait_for_two_epochs(jobs, "slow")
    worker_1 = jobs.cluster.core.read_namespaced_pod("slow-worker-1", jobs.namespace)
    agent = container_pid(worker_1)
    (rank,) = (int(pid) for pid in Path(f"/proc/{agent}/task/{agent}/children").read_text().split())

    def straggler() -> dict[str, Any]:
        return condition_of(jobs.status("slow"), "Straggler")

    def names_rank_1() -> bool:
        said = straggler()
        return said.get("status") == "True" and said["message"].startswith(
            f"rank 1 (pod slow-worker-1, node {worker_1.spec.node_name}) takes "
        )

    with cpu_quota(f"kubeddp-e2e-straggler-{os.getpid()}") as quota:
        quota.slow(rank)
        slowed = time.monotonic()
        wait_for(names_rank_1, "Straggler=True naming rank 1", timeout=120)
        print(f"straggler named {time.monotonic() - slowed:.0f} s after: {straggler()['message']}")
        jobs.wait_events("slow", Reason.STRAGGLER_DETECTED)
        quota.release(rank)
        wait_for(lambda: not names_rank_1(), "rank 1 no longer the straggler", timeout=120)


@contextlib.contextmanager
def node_stopped(platform: Platform, pods: list[Any]) -> Iterator[None]:
    """The real node dies as far as the cluster can tell: its kubelet and the pods' trainers
    stopped (SIGSTOP); both continued (SIGCONT) afterwards, whatever happened."""
    if not isinstance(platform, DevPlatform):
        pytest.skip("stopping the node's kubelet needs the dev cluster's real node")
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import node

    record = node.read_record()
    assert record is not None, "the real node runs"
    kubelet = next(c["pid"] for c in record["components"] if c["name"] == "kubelet")
    os.kill(kubelet, signal.SIGSTOP)
    try:
        for pod in pods:
            platform.kill(pod, signal.SIGSTOP)
        yield
    finally:
        for pod in pods:
            with contextlib.suppress(Exception):
                platform.kill(pod, signal.SIGCONT)
        os.kill(kubelet, signal.SIGCONT)
        wait_for(node.node_ready, "the real node to be Ready again", timeout=120)


def test_a_dead_node_restarts_the_group_instead_of_freezing(platform: Platform, jobs: Jobs) -> None:
    """The node's kubelet and trainers stop; the job sets nothing about tolerations. The node
    controller evicts the pods after the job's default toleration; no kubelet confirms it: the
    job restarts with NodeLost naming the node, the old pods are force-deleted at once, and the
    next attempt's pods are created, Pending, saying why (the only node that fits is down)."""
    trainer = {**DIGITS, "model": "mlp", "epochs": 400}
    # Recreate: the whole group on the lost node goes (in place, worker 0 lost does the same)
    spec = {"trainer": trainer, "runPolicy": RECREATE}
    jobs.create(cpu_job(platform, "orphan", **spec))
    old = jobs.wait_pods("orphan", 2, timeout=TRAINING_TIMEOUT)
    with node_stopped(platform, old):
        died = time.monotonic()
        restarted = wait_restarted(jobs, "orphan", died, timeout=180)
        new = jobs.wait_pods("orphan", 2, phase="Pending", attempt=1, timeout=120)
        created = time.monotonic() - died
        print(f"node death -> restart {restarted:.0f} s, -> new pods {created:.0f} s")
        assert {p.metadata.uid for p in new}.isdisjoint(p.metadata.uid for p in old)
        status = wait_for(
            lambda: (
                (s := jobs.status("orphan")).get("phase") == "Pending"
                and condition_of(s, "Schedulable").get("status") == "False"
                and s
            ),
            "the next attempt Pending, Schedulable=False",
            timeout=60,
        )
        failure = status["failure"]
        assert failure["reason"] == "NodeLost", failure
        assert failure["message"].startswith(f"node {old[0].spec.node_name} stopped reporting")
        assert "untolerated taint" in condition_of(status, "Schedulable")["message"]


def condition_of(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((dict(c) for c in status.get("conditions", []) if c["type"] == type_), {})


HOG = "import time; x = bytearray(1 << 30); time.sleep(60)"


@pytest.mark.parametrize(
    ("command", "exit_code"),
    [
        (["python", "-c", HOG], 137),
        # As under torchrun: the OOM killer takes a child (a rank), the parent exits 1.
        (["sh", "-c", f"python -c '{HOG}'; exit 1"], 1),
    ],
    ids=["the worker itself", "a rank under its launcher"],
)
def test_an_oom_kill_is_reported_and_restarted_like_137(
    platform: Platform, jobs: Jobs, command: list[str], exit_code: int
) -> None:
    """Scenario 4: over its memory limit -> OOMKilled -> status.failure says so; the group
    restarts (as for 137) until backoffLimit."""
    spec = {
        "command": command,
        "resources": {"limits": {"memory": "128Mi"}},
        "runPolicy": {"backoffLimit": 1, **RECREATE},
    }
    jobs.create(cpu_job(platform, "hog", **spec))
    status = jobs.wait_phase("hog", "Failed", timeout=120)
    assert status["restarts"] == 1
    assert status["failure"]["exitCode"] == exit_code
    assert status["failure"]["reason"] == "OOMKilled"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == Reason.BACKOFF_LIMIT_EXCEEDED
    assert "OOMKilled" in failed["message"]


def test_a_user_error_fails_at_once_with_the_last_log_lines(platform: Platform, jobs: Jobs) -> None:
    """Scenario 5: a non-retryable exit -> Failed, naming the pod and the code, with the
    container's last log lines in status.failure and the Event."""
    bad = ["python", "-c", "import sys; print('unknown flag --epochz'); sys.exit(2)"]
    jobs.create(cpu_job(platform, "typo", command=bad))
    status = jobs.wait_phase("typo", "Failed", timeout=120)
    failure = status["failure"]
    assert failure["exitCode"] == 2
    assert failure["pod"] in ("typo-worker-0", "typo-worker-1")
    assert "unknown flag --epochz" in failure["message"]
    assert status["restarts"] == 0
    selector = f"involvedObject.name=typo,reason={Reason.NON_RETRYABLE_EXIT_CODE}"
    events = wait_for(  # posted just after the status is written
        lambda: (
            jobs.cluster.core.list_namespaced_event(jobs.namespace, field_selector=selector).items
        ),
        "the NonRetryableExitCode Event",
    )
    assert "unknown flag --epochz" in events[0].message


# `KUBEDDP_E2E_TAKEOVERS=10` runs the takeover scenario that many times (one real node held).
TAKEOVER_RUNS = int(os.environ.get("KUBEDDP_E2E_TAKEOVERS", "1"))


class OperatorLogs:
    """`kubectl logs -f` of the operator's pods, kept after they are deleted: what the old
    leader did while it stopped, and what the new one saw when it started."""

    def __init__(self, jobs: Jobs, tmp: Path) -> None:
        self.jobs, self.tmp = jobs, tmp
        self.followers: list[tuple[subprocess.Popen[bytes], Path]] = []

    def follow(self, pod: str) -> None:
        cluster = self.jobs.cluster
        path = self.tmp / f"{pod}.log"
        command = [
            str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}",
            "logs", "-f", pod, "-n", OPERATOR_NAMESPACE,
        ]  # fmt: skip
        with path.open("wb") as sink:
            process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        self.followers.append((process, path))

    def text(self) -> str:
        for process, _ in self.followers:
            process.terminate()
            process.wait()
        return "\n".join(f"--- {p.name}\n{p.read_text()[-6000:]}" for _, p in self.followers)


@pytest.mark.parametrize("run", range(TAKEOVER_RUNS))
def test_the_operator_pod_deleted_mid_job(
    platform: Platform, jobs: Jobs, operator: dict[str, Any], tmp_path: Path, run: int
) -> None:
    """Scenario 6: the leader's pod is deleted while a job trains; the Deployment's next pod
    takes over, adopts the job (no duplicate pods, no restart) and finishes it."""
    trainer = {**DIGITS, "model": "wide-resnet", "wrnDepth": 10, "wrnWidth": 1, "epochs": 6}
    jobs.create(cpu_job(platform, "adopted", trainer=trainer))
    running = jobs.wait_pods("adopted", 2, timeout=TRAINING_TIMEOUT)
    uids = {p.metadata.name: p.metadata.uid for p in running}
    core = jobs.cluster.core
    selector = "app.kubernetes.io/name=kube-ddp"

    def operator_pods() -> set[str]:
        listed = core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=selector).items
        return {p.metadata.name for p in listed}

    before = operator_pods()
    logs_of = OperatorLogs(jobs, tmp_path)
    for name in before:
        logs_of.follow(name)
        core.delete_namespaced_pod(name, OPERATOR_NAMESPACE)
    newcomers = wait_for(lambda: operator_pods() - before, "a new operator pod", timeout=60)
    for name in newcomers:
        wait_for(
            lambda n=name: (
                core.read_namespaced_pod(n, OPERATOR_NAMESPACE).status.phase == "Running"
            ),
            f"{name} to run",
            timeout=60,
        )
        logs_of.follow(name)
    status = jobs.wait_phase("adopted", "Succeeded", timeout=TRAINING_TIMEOUT)
    after = operator_pods()
    assert after and not after & before  # a new operator pod did it
    said = (status.get("failure"), status.get("conditions"), jobs.events("adopted"))
    assert status["restarts"] == 0, f"{said}\n{logs_of.text()}"
    # No pod was recreated: those left are the first ones (a worker still running when worker 0
    # finished is removed by cleanPodPolicy Running).
    left = {p.metadata.name: p.metadata.uid for p in jobs.pods("adopted")}
    assert left.items() <= uids.items() and "adopted-worker-0" in left, (left, uids)
    logs_of.text()


def test_a_deleted_job_takes_every_child_with_it(platform: Platform, jobs: Jobs) -> None:
    """Scenario 7: the job deleted mid-run -> its pods, Service and reporter RBAC are gone."""
    trainer = {**DIGITS, "model": "mlp", "epochs": 200}
    jobs.create(cpu_job(platform, "doomed", trainer=trainer))
    jobs.wait_pods("doomed", 2, timeout=TRAINING_TIMEOUT)
    jobs.delete("doomed")
    core, rbac = jobs.cluster.core, jobs.cluster.rbac
    selector = f"{names.LABEL_JOB_NAME}=doomed"

    def children() -> list[str]:
        listed = [
            *core.list_namespaced_pod(jobs.namespace, label_selector=selector).items,
            *core.list_namespaced_service(jobs.namespace, label_selector=selector).items,
            *core.list_namespaced_service_account(jobs.namespace, label_selector=selector).items,
            *rbac.list_namespaced_role(jobs.namespace, label_selector=selector).items,
            *rbac.list_namespaced_role_binding(jobs.namespace, label_selector=selector).items,
        ]
        return [f"{type(o).__name__}/{o.metadata.name}" for o in listed]

    wait_for(lambda: not children(), "the job's children to be gone", timeout=90)
    with pytest.raises(kubernetes.client.ApiException):
        jobs.get("doomed")


OWN_SCRIPT = REPO / "manifests" / "examples" / "own-script"


def own_script_example(jobs: Jobs) -> dict[str, Any]:
    """manifests/examples/own-script as its header says to apply it: the script in a ConfigMap
    of the job's namespace, and the job's document as shipped."""
    jobs.cluster.kubectl(
        "create", "configmap", "own-script", f"--from-file={OWN_SCRIPT / 'train.py'}",
        "-n", jobs.namespace,
    )  # fmt: skip
    document: dict[str, Any] = yaml.safe_load((OWN_SCRIPT / "job.yaml").read_text())
    return document


def test_the_own_script_example_trains_under_kube_ddps_torchrun(
    platform: Platform, jobs: Jobs
) -> None:
    """The own-script example: `python train.py` with nprocPerNode 2, which kube-ddp starts
    under torchrun: 4 ranks in 2 pods, each with its RANK and LOCAL_RANK from torchrun."""
    document = own_script_example(jobs)
    spec = platform.job_spec(document["spec"])
    # Both pods stay for their logs: worker 1 may still be exiting when worker 0's success ends
    # the job, and cleanPodPolicy Running, the default, would remove it then (seen in CI).
    spec["runPolicy"] = {**spec.get("runPolicy", {}), "cleanPodPolicy": "None"}
    jobs.create({**document, "spec": spec})
    status = jobs.wait_phase("own-script", "Succeeded", timeout=TRAINING_TIMEOUT)
    assert status["restarts"] == 0, status.get("failure")
    said = logs(jobs, "own-script-worker-0") + logs(jobs, "own-script-worker-1")
    for rank, local in ((0, 0), (1, 1), (2, 0), (3, 1)):
        assert f"rank {rank} of 4 (local rank {local})" in said, said[-3000:]
    assert "done: 200 steps on 4 ranks" in said


def test_a_hung_rank_of_the_users_own_script_restarts_at_the_deadline(
    platform: Platform, jobs: Jobs
) -> None:
    """Issue 25: a plain PyTorch script that reports with ddp_trainer.progress.report gets the
    progress deadline as the trainer does. One process a pod (so the script is the container's
    own process, not under torchrun) and many epochs; once rank 0 has reported, rank 1 stops
    (SIGSTOP): rank 0 blocks in its all-reduce, its reports stop, and the group restarts with
    ProgressDeadlineExceeded naming rank 1, long before torch's own 30 min gloo timeout would
    end it."""
    document = own_script_example(jobs)
    spec = {
        **document["spec"],
        "nprocPerNode": 1,
        "args": ["--epochs", "100000", "--steps-per-epoch", "100"],
        # Recreate: the script is the pod's own process, no agent in front of it
        "runPolicy": {"backoffLimit": 1, "progressDeadlineSeconds": PROGRESS_DEADLINE, **RECREATE},
    }
    jobs.create({**document, "spec": platform.job_spec(spec)})
    wait_for(
        lambda: (jobs.status("own-script").get("training") or {}).get("step") is not None,
        "the script's first progress report",
        timeout=TRAINING_TIMEOUT,
        interval=0.5,
    )
    victim = jobs.cluster.core.read_namespaced_pod("own-script-worker-1", jobs.namespace)
    platform.kill(victim, signal.SIGSTOP)
    hung = time.monotonic()
    took = wait_restarted(jobs, "own-script", hung, timeout=PROGRESS_DEADLINE + 90)
    print(f"own script: hang -> group restart: {took:.1f} s")
    failure = jobs.status("own-script")["failure"]
    assert failure["reason"] == "ProgressDeadlineExceeded", failure
    assert (failure["pod"], failure["rank"]) == ("own-script-worker-1", 1), failure
    assert failure["message"].startswith("rank 1 (pod own-script-worker-1, node "), failure
    jobs.wait_events("own-script", Reason.PROGRESS_DEADLINE_EXCEEDED)
    assert took <= PROGRESS_DEADLINE + 30 + 10  # the last report is at most a heartbeat old


def wait_containers_not_started(jobs: Jobs, name: str, timeout: float) -> dict[str, Any]:
    """The job's ContainersStarted condition once it is False."""

    def stuck() -> dict[str, Any] | None:
        found = [
            c
            for c in jobs.status(name).get("conditions", [])
            if c["type"] == "ContainersStarted" and c["status"] == "False"
        ]
        return found[0] if found else None

    return wait_for(stuck, f"ContainersStarted=False on {name}", timeout=timeout)


def test_a_volume_the_kubelet_cannot_mount_is_said_on_the_job_until_it_exists(
    platform: Platform, jobs: Jobs
) -> None:
    """The own-script example applied before its ConfigMap (a newcomer's first try): the
    pods wait in ContainerCreating and only a FailedMount Event says why; the job says it,
    naming the ConfigMap and what to do, and runs once the ConfigMap is made."""
    document = yaml.safe_load((OWN_SCRIPT / "job.yaml").read_text())
    document["spec"] = platform.job_spec(document["spec"])
    jobs.create(document)

    said = wait_containers_not_started(jobs, "own-script", timeout=90)
    assert said["reason"] == Reason.VOLUME_CANNOT_MOUNT, said
    assert said["message"].startswith("own-script-worker-"), said
    assert 'configmap "own-script" not found' in said["message"], said
    assert "create that ConfigMap in the job's namespace" in said["message"], said
    assert jobs.status("own-script")["phase"] == "Starting"
    jobs.wait_events("own-script", Reason.VOLUME_CANNOT_MOUNT)
    jobs.cluster.kubectl(
        "create", "configmap", "own-script", f"--from-file={OWN_SCRIPT / 'train.py'}",
        "-n", jobs.namespace,
    )  # fmt: skip
    wait_for(
        lambda: jobs.status("own-script").get("phase") == "Running",
        "the job Running once its ConfigMap exists",
        timeout=TRAINING_TIMEOUT,
        interval=1,
    )
    started = [
        c for c in jobs.status("own-script")["conditions"] if c["type"] == "ContainersStarted"
    ]
    assert started[0]["status"] == "True", started


def test_a_container_the_kubelet_cannot_start_is_said_on_the_job(
    platform: Platform, jobs: Jobs
) -> None:
    """A worker image the node does not have (and may not pull): the pods stay Pending and
    only their container status says why; the job says it, quoting the kubelet, and waits
    in Starting."""
    jobs.create(cpu_job(platform, "nopull", image="localhost/kube-ddp-e2e-absent:none"))

    said = wait_containers_not_started(jobs, "nopull", timeout=60)
    assert said["reason"] == "ContainerCannotStart"
    assert said["message"].startswith("nopull-worker-"), said
    assert "ErrImageNeverPull" in said["message"] or "ImagePull" in said["message"], said
    assert "localhost/kube-ddp-e2e-absent:none" in said["message"], said
    assert jobs.status("nopull")["phase"] == "Starting"  # placed, never running
    jobs.wait_events("nopull", "ContainerCannotStart")
