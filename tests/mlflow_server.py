"""A real MLflow tracking server for tests: the `mlflow` package's own `mlflow server`, its
runs in a SQLite file, on a free port, stopped after; and what it holds, read by MLflow's
client.

The client reads in a process of its own: importing mlflow probes the platform for its
telemetry (`uname -p`), a host command the test session would otherwise count as its own.
Every process here runs with MLflow's telemetry off: tests reach no outside service.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kube_ddp.local.plan import free_port

START_TIMEOUT_S = 90.0  # its first start creates the SQLite schema: 15 s on 2 busy cores
NO_TELEMETRY = {"MLFLOW_DISABLE_TELEMETRY": "true"}

# Every run of the default experiment: its status, tags, params and each metric's history.
_READ_RUNS = """
import json, sys
from mlflow import MlflowClient
client = MlflowClient(tracking_uri=sys.argv[1])
runs = []
for run in client.search_runs(["0"]):
    run_id = run.info.run_id
    history = {
        key: [[m.step, m.value] for m in client.get_metric_history(run_id, key)]
        for key in run.data.metrics
    }
    runs.append({"run_id": run_id, "status": run.info.status, "tags": run.data.tags,
                 "params": run.data.params, "metrics": history})
print(json.dumps(runs))
"""


@contextmanager
def running_mlflow_server(root: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """`mlflow server` storing in `root`, listening on `host`, until the block ends; yields its
    URI."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    uri = f"http://{host}:{port}"
    log = (root / "server.log").open("w")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            f"--backend-store-uri=sqlite:///{root / 'mlflow.db'}",
            f"--default-artifact-root={root / 'artifacts'}",
            f"--host={host}",
            f"--port={port}",
            "--workers=1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **NO_TELEMETRY},
        start_new_session=True,  # its workers go with it
    )
    try:
        _wait_until_healthy(uri, process, root / "server.log")
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _wait_until_healthy(uri: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited {process.returncode}:\n{log.read_text()}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{uri}/health", timeout=2) as answer,
        ):
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"mlflow server did not answer at {uri} in {START_TIMEOUT_S} s")


def runs(uri: str) -> list[dict[str, Any]]:
    """Every run the server at `uri` holds in its default experiment, as MlflowClient reads it:
    run_id, status, tags, params, and metrics (each key's [step, value] history in order)."""
    done = subprocess.run(
        [sys.executable, "-c", _READ_RUNS, uri],
        env={**os.environ, **NO_TELEMETRY},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: list[dict[str, Any]] = json.loads(done.stdout)
    return found
