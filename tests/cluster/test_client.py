"""The Python client (`kube_ddp.client`) against the real API server, with the operator running:
docs/python-client.md's notebook as printed, progress seen while waiting, and each error a user
meets. The pods are kwok's: the tests end them and report the trainer's progress as
tests/cluster/test_lifecycle.py does, and since they write no logs, what `get_job_logs` says
then is tested (test_clusterview.py does the same for `kube-ddp logs`)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_ddp.api import DDPTrainingJob, DDPTrainingJobSpec, RunPolicy
from kube_ddp.client import (
    JobExistsError,
    JobFailedError,
    JobNotFoundError,
    LogsUnavailableError,
    TrainerClient,
    WaitTimeoutError,
    new_job,
)
from tests.cluster.operator_support import Jobs, OperatorProcess
from tests.cluster.support import REPO, Cluster

NOTEBOOK = REPO / "docs" / "python-client.md"


def notebook_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", NOTEBOOK.read_text(), re.MULTILINE | re.DOTALL)


def kubeconfig_in(cluster: Cluster, namespace: str, path: Path) -> Path:
    """The admin kubeconfig with its current context in `namespace`, as a user's would be."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for context in config["contexts"]:
        if context["name"] == config["current-context"]:
            context["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def client(cluster: Cluster, jobs: Jobs, tmp_path: Path) -> Iterator[TrainerClient]:
    with TrainerClient(kubeconfig=kubeconfig_in(cluster, jobs.namespace, tmp_path / "kube")) as c:
        yield c


@contextmanager
def in_background(work: Callable[[], None]) -> Iterator[None]:
    """`work` in a thread while the block waits on the client; its exception is the test's."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(timeout=60)
    if failed:
        raise failed[0]


def trains_and_succeeds(jobs: Jobs, name: str, epochs: int) -> Callable[[], None]:
    """Rank 0 of the trainer on kwok's pods: one report per epoch, then worker 0 exits 0."""

    def work() -> None:
        jobs.wait_phase(name, "Running")
        for epoch in range(1, epochs + 1):
            training = {"epoch": epoch, "epochs": epochs, "valAccuracy": 0.5 + epoch / 100}
            jobs.report_training(name, {**training, "bestValAccuracy": training["valAccuracy"]})
            time.sleep(0.5)  # a poll of 0.2 s sees each
        jobs.end_worker(f"{name}-worker-0", 0)

    return work


def test_the_notebook_runs_as_printed(
    cluster: Cluster,
    jobs: Jobs,
    operator: OperatorProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """TrainerClient() with no arguments: the current context of $KUBECONFIG, its namespace."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_in(cluster, jobs.namespace, tmp_path / "k")))
    build_and_run, suspend_and_resume, logs, result, local = notebook_blocks()
    assert "get_job_logs" in logs and "run_local" in local  # the two this test leaves out
    notebook: dict[str, Any] = {}
    exec(build_and_run, notebook)
    client = notebook["client"]
    try:
        assert client.namespace == jobs.namespace
        assert "digits  Running" in capsys.readouterr().out
        exec(suspend_and_resume, notebook)
        assert jobs.status("digits")["restarts"] == 0
        with in_background(trains_and_succeeds(jobs, "digits", epochs=2)):
            exec(result, notebook)
        out = capsys.readouterr().out
        assert "digits  Succeeded  epoch 2/2  val-acc 0.520" in out
        assert "Succeeded: val-acc 0.52 after 2 epochs" in out
        assert "[('digits', 'Succeeded')]" in out
        with pytest.raises(JobNotFoundError):
            client.get_job("digits")
    finally:
        client.close()


def test_progress_is_seen_while_waiting(
    client: TrainerClient, jobs: Jobs, operator: OperatorProcess
) -> None:
    spec = DDPTrainingJobSpec(nodes=2, run_policy=RunPolicy(backoff_limit=1))
    assert client.train(new_job("seen", spec)) == "seen"
    seen: list[DDPTrainingJob] = []
    with in_background(trains_and_succeeds(jobs, "seen", epochs=3)):
        done = client.wait_for_job_status("seen", polling_interval=0.2, callbacks=[seen.append])
    assert done.status is not None and done.status.phase == "Succeeded"
    assert done.status.workers is not None and done.status.workers.total == 2
    running = [job.status for job in seen if job.status and job.status.phase == "Running"]
    epochs = [s.training.epoch for s in running if s.training and s.training.epoch is not None]
    assert epochs == sorted(epochs) and epochs, [job.status for job in seen]
    assert seen[-1] == done
    assert [job.name for job in client.list_jobs()] == ["seen"]
    assert client.get_job_status("seen").phase == "Succeeded"


def test_each_error_names_the_job_and_the_fix(
    client: TrainerClient, jobs: Jobs, operator: OperatorProcess
) -> None:
    namespace = jobs.namespace
    with pytest.raises(JobNotFoundError, match=f"no job nope in namespace {namespace}: list_jobs"):
        client.get_job("nope")
    for call in (client.suspend_job, client.delete_job, client.get_job_logs):
        with pytest.raises(JobNotFoundError, match="no job nope"):
            call("nope")

    suspended = new_job("held", DDPTrainingJobSpec(nodes=1, run_policy=RunPolicy(suspend=True)))
    client.train(suspended)
    with pytest.raises(JobExistsError, match=r'exists in namespace .*: delete_job\("held"'):
        client.train(suspended)
    client.wait_for_job_status("held", {"Suspended"}, timeout=30, polling_interval=0.2)
    with pytest.raises(WaitTimeoutError) as timed_out:
        client.wait_for_job_status("held", timeout=1, polling_interval=0.2)
    assert str(timed_out.value).startswith(
        f"job held in namespace {namespace} is Suspended after 1 s of waiting for Succeeded: "
        "wait longer (timeout=...)"
    )
    with pytest.raises(LogsUnavailableError, match="job held has no worker pods now: pending, "):
        client.get_job_logs("held")

    never = RunPolicy(restart_policy="Never")
    client.train(new_job("broken", DDPTrainingJobSpec(nodes=2, run_policy=never)))
    client.wait_for_job_status("broken", {"Running"}, timeout=30, polling_interval=0.2)
    with pytest.raises(LogsUnavailableError, match=r"no worker 2 now \(its workers: 0 to 1 "):
        client.get_job_logs("broken", worker=2)
    with pytest.raises(LogsUnavailableError) as no_log:
        list(client.get_job_logs("broken", worker=1))
    assert str(no_log.value).startswith("no log of worker 1 of job broken (pod broken-worker-1): ")
    jobs.end_worker("broken-worker-1", 1)
    with pytest.raises(JobFailedError) as failed:
        client.wait_for_job_status("broken", timeout=30, polling_interval=0.2)
    assert str(failed.value).startswith(
        f"job broken in namespace {namespace} Failed (WorkerFailed: "
    )
    assert "while waiting for Succeeded: get_job('broken').status.failure names the worker" in str(
        failed.value
    )
    failure = failed.value.last.status.failure
    assert (failure.pod, failure.exit_code) == ("broken-worker-1", 1)

    client.delete_job("broken", wait=True)
    assert [job.name for job in client.list_jobs()] == ["held"]
    with pytest.raises(ValueError, match="use TrainerClient\\(namespace='elsewhere'\\)"):
        client.train(new_job("away", DDPTrainingJobSpec(nodes=1), namespace="elsewhere"))
