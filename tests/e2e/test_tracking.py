"""The quick start's job on the real node with its curves where ML people look: TensorBoard
event files in a directory on the node, read back by TensorBoard's own reader, and a real MLflow
server on the host at the pods' gateway address (`MLFLOW_TRACKING_URI` in the job's env). A rank
SIGKILLed after two epochs restarts the group in place, which resumes from its checkpoint: one
curve and one MLflow run come out, each step once, and `kube-ddp describe --plot` draws it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests import mlflow_server
from tests.cluster.operator_support import Jobs
from tests.cluster.support import REPO, load_dev_cluster, wait_for
from tests.cluster.test_clusterview import kube_ddp
from tests.e2e.platform import DevPlatform, Platform
from tests.e2e.test_jobs import TRAINING_TIMEOUT
from tests.mlflow_server import running_mlflow_server

QUICK_START = REPO / "manifests" / "examples" / "digits-cpu.yaml"


@pytest.fixture
def mlflow_uri(platform: Platform, tmp_path: Path) -> Iterator[str]:
    if not isinstance(platform, DevPlatform):
        pytest.skip("the MLflow server runs on the dev cluster's host, the real node")
    # The pods' bridge address: the host as the pods reach it (a private address, which
    # MLflow's server accepts as a Host header by default).
    gateway = load_dev_cluster().node.GATEWAY
    with running_mlflow_server(tmp_path / "mlflow", host=gateway) as uri:
        yield uri


def steps(accumulator: EventAccumulator, tag: str) -> list[int]:
    return [event.step for event in accumulator.Scalars(tag)]


def test_the_quick_start_s_curves_survive_a_group_restart_in_tensorboard_and_mlflow(
    platform: Platform, jobs: Jobs, mlflow_uri: str, tmp_path: Path
) -> None:
    document: dict[str, Any] = yaml.safe_load(QUICK_START.read_text())
    volumes = [platform.scratch_volume(n, jobs.namespace) for n in ("logs", "checkpoints")]
    spec = document["spec"]
    spec["trainer"] |= {"logDir": "/logs", "checkpointDir": "/checkpoints", "targetAccuracy": None}
    spec["trainer"] = {k: v for k, v in spec["trainer"].items() if v is not None}
    spec["trainer"]["epochs"] = 5
    spec["env"] = [{"name": "MLFLOW_TRACKING_URI", "value": mlflow_uri}]
    spec["template"] = {
        "volumes": volumes,
        "volumeMounts": [{"name": v["name"], "mountPath": f"/{v['name']}"} for v in volumes],
    }
    document["spec"] = platform.job_spec(spec)
    jobs.create(document)
    wait_for(
        lambda: (jobs.status("digits").get("training") or {}).get("epoch", 0) >= 2,
        "two epochs (and their checkpoints)",
        timeout=TRAINING_TIMEOUT,
        interval=0.5,
    )
    victim = jobs.cluster.core.read_namespaced_pod("digits-worker-1", jobs.namespace)
    platform.kill_rank(victim, signal.SIGKILL)
    status = jobs.wait_phase("digits", "Succeeded", timeout=TRAINING_TIMEOUT)
    assert status["restarts"] == 1, status.get("failure")
    per_epoch = status["training"]["stepsPerEpoch"]
    epochs = list(range(per_epoch, 5 * per_epoch + 1, per_epoch))

    # TensorBoard, as its reader shows the directory: two attempts' files, one line.
    log_dir = Path(volumes[0]["hostPath"]["path"])
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 2
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    assert steps(accumulator, "epoch/val_accuracy") == epochs
    logged = steps(accumulator, "train/loss")
    assert logged == sorted(set(logged)) and logged[-1] <= epochs[-1], logged

    # MLflow: one run for the job, continued, finished, each step once.
    (run,) = mlflow_server.runs(mlflow_uri)
    assert run["status"] == "FINISHED"
    assert run["tags"]["kubeddp.io/job-name"] == "digits"
    assert run["tags"]["kubeddp.io/job-namespace"] == jobs.namespace
    assert [step for step, _ in run["metrics"]["epoch/val_accuracy"]] == epochs
    assert run["metrics"]["epoch/val_accuracy"][-1][1] > 0.9

    # The same run in the terminal and as an image for a report.
    png = tmp_path / "digits.png"
    done = kube_ddp(jobs.cluster, "describe", "digits", "-n", jobs.namespace, "--plot", str(png))
    assert done.returncode == 0, done.stderr
    assert "┃ restart (" in done.stdout, done.stdout  # the curve's key: where it restarted
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
