"""`kube-ddp describe` and `kube-ddp logs` against the real API server, over kubectl with the
user's kubeconfig conventions. The pods are kwok's, so they have no logs: what `logs` says
then is tested, and no log is faked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cluster.operator_support import Jobs, OperatorProcess, job_manifest
from tests.cluster.support import Cluster, wait_for

KUBE_DDP = str(Path(sys.executable).parent / "kube-ddp")
KUBECTL_DDP = str(Path(sys.executable).parent / "kubectl-ddp")


def kube_ddp(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with kubectl from the cluster's bin dir and the admin kubeconfig."""
    env = {**os.environ, "KUBECTL": str(cluster.bin_dir / "kubectl")}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [KUBE_DDP, *args, f"--kubeconfig={cluster.kubeconfig}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def report_progress(jobs: Jobs, name: str) -> None:
    """What the trainer's rank 0 writes: a merge patch of status.training."""
    training = {
        "epoch": 3,
        "epochs": 12,
        "loss": 0.4125,
        "valAccuracy": 0.9123,
        "bestValAccuracy": 0.93,
        "imagesPerSec": 1234.0,
        "updatedAt": "2026-11-23T16:00:00Z",
    }
    jobs.report_training(name, training)


def wait_curve(jobs: Jobs, name: str, epochs: list[int]) -> None:
    """Until the operator has kept rank 0's epoch ends as the points of the job's curve."""

    def kept() -> bool:
        points = jobs.status(name).get("trainingHistory", {}).get("points", [])
        return [p["epoch"] for p in points] == epochs

    wait_for(kept, f"{name}'s status.trainingHistory to hold epochs {epochs}")


def test_describe_shows_a_restarted_job_on_one_screen(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess, tmp_path: Path
) -> None:
    policy = {"backoffLimit": 2, "restartStrategy": "Recreate"}  # a group restart: attempt 1
    jobs.create(job_manifest("bar", nodes=2, runPolicy=policy))
    jobs.wait_pods("bar", 2)
    jobs.wait_phase("bar", "Running")
    for epoch in (1, 2):  # epoch ends, as rank 0 reports them (step 0)
        jobs.report_training("bar", {"epoch": epoch, "step": 0, "loss": 1.5 / epoch})
        wait_curve(jobs, "bar", list(range(1, epoch + 1)))
    jobs.end_worker("bar-worker-1", 137)
    jobs.wait_pods("bar", 2, attempt=1)
    jobs.wait_phase("bar", "Running")
    report_progress(jobs, "bar")
    wait_curve(jobs, "bar", [1, 2, 3])

    png = tmp_path / "bar.png"
    done = kube_ddp(cluster, "describe", "bar", "-n", jobs.namespace, "--plot", str(png))
    assert done.returncode == 0, done.stderr
    screen = done.stdout
    assert f"Namespace:    {jobs.namespace}\n" in screen
    assert "Phase:        Running\n" in screen
    assert "Restarts:     1 of at most 2 (attempt 1)\n" in screen
    assert "Workers:      2 (2 running, 0 pending, 0 succeeded, 0 failed)\n" in screen
    assert "Failure:      bar-worker-1 exit 137 (Error)" in screen
    assert (
        "Training:     epoch 3/12  loss 0.4125  val-acc 0.9123 (best 0.9300)  images/s 1234"
    ) in screen
    conditions = screen.split("Conditions:\n")[1].split("\n\n")[0]
    assert any(
        line.split()[:3] == ["Restarting", "False", "WorkersRunning"]
        for line in conditions.splitlines()
    )
    pods = screen.split("Pods:\n")[1].split("\n\n")[0].splitlines()
    rows = [line.split() for line in pods[1:]]
    assert [(row[0], row[1], row[2]) for row in rows if row[1] == "Running"] == [
        ("bar-worker-0", "Running", "1"),
        ("bar-worker-1", "Running", "1"),
    ]
    events = screen.split("Events (last ")[1]
    assert "WorkerFailed" in events and "bar-worker-1 exited with code 137" in events
    # the curve the operator kept: epochs 1 to 3, the restart marked after epoch 2
    curve = screen.split("\nCurve:\n")[1].splitlines()
    assert f"{jobs.namespace}/bar" in curve[0]
    ticks = curve[-3].split()
    assert (float(ticks[0]), float(ticks[-1])) == (1, 3)
    assert curve[-1].strip().split("   ") == ["• loss", "+ val-acc (right)", "┃ restart (2)"]
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_kubectl_ddp_is_a_kubectl_plugin(cluster: Cluster, jobs: Jobs) -> None:
    """`kubectl ddp describe`: kubectl finds kubectl-ddp on PATH; the plugin reads the same
    KUBECONFIG kubectl does."""
    jobs.create(job_manifest("idle", nodes=1))
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(KUBECTL_DDP).parent), os.environ.get("PATH", "")]),
        "KUBECONFIG": str(cluster.kubeconfig),
        "KUBECTL": str(cluster.bin_dir / "kubectl"),
    }
    done = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "ddp", "describe", "idle", "-n", jobs.namespace],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Name:         idle\n" in done.stdout
    assert "Phase:        -\n" in done.stdout  # no operator runs here
    assert "Training:     no progress reported yet" in done.stdout


def test_describe_of_a_missing_job_says_so(cluster: Cluster, jobs: Jobs) -> None:
    done = kube_ddp(cluster, "describe", "nope", "-n", jobs.namespace)
    assert done.returncode == 1
    assert 'ddptrainingjobs.kubeddp.io "nope" not found' in done.stderr


def test_logs_say_which_worker_has_none(
    cluster: Cluster, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("bar", nodes=2))
    jobs.wait_pods("bar", 2)
    done = kube_ddp(cluster, "logs", "bar", "-n", jobs.namespace)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "[worker-0] no logs from bar-worker-0",
        "[worker-1] no logs from bar-worker-1",
    ]
    assert all("the server could not find the requested resource" in line for line in lines)

    only_one = kube_ddp(cluster, "logs", "bar", "--worker=1", "-n", jobs.namespace)
    assert only_one.stderr.startswith("[worker-1] no logs from bar-worker-1")
    missing = kube_ddp(cluster, "logs", "bar", "--worker=5", "-n", jobs.namespace)
    assert (missing.returncode, missing.stderr) == (1, "job bar has no worker 5\n")


def test_logs_of_a_job_without_pods(cluster: Cluster, jobs: Jobs) -> None:
    done = kube_ddp(cluster, "logs", "nope", "-n", jobs.namespace)
    assert done.returncode == 1
    assert done.stderr.startswith(f"no worker pods of job nope in namespace {jobs.namespace}")
