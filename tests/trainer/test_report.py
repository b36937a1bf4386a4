"""status.training reports: the patch body, the request, the backoff, and a whole run, all
against a small HTTP server on 127.0.0.1 standing in for the API server."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from ddp_trainer import progress
from ddp_trainer.contract import EXIT_PEER_LOST, MESSAGE_LENGTH
from ddp_trainer.culprit import stall_fields
from ddp_trainer.report import (
    Heartbeat,
    StatusReporter,
    position_fields,
    status_url,
    training_patch,
)
from kube_ddp.api import TrainingProgress
from kube_ddp.local.plan import free_port
from tests.trainer import support
from tests.trainer.support import FakeApiServer

STATUS_PATH = "/apis/kubeddp.io/v1alpha1/namespaces/team-a/ddptrainingjobs/mnist/status"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


EPOCH: dict[str, Any] = {
    "epoch": 3,
    "epochs": 10,
    "loss": 0.123456789,
    "val_accuracy": 0.9,
    "best_val_accuracy": 0.91,
    "images_per_sec": 1234.56,
    "now": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
}
PATCH = training_patch(**EPOCH)


def test_patch_body_is_the_operators_training_progress() -> None:
    assert PATCH == {
        "status": {
            "training": {
                "epoch": 3,
                "epochs": 10,
                "loss": 0.123457,
                "valAccuracy": 0.9,
                "bestValAccuracy": 0.91,
                "imagesPerSec": 1234.6,
                "updatedAt": "2026-01-02T03:04:05Z",
            }
        }
    }


def test_the_validation_loss_goes_with_the_epoch_when_given() -> None:
    """status.training.valLoss: the curve's val-loss (status.trainingHistory)."""
    patch = training_patch(**EPOCH, val_loss=0.123456789)
    assert patch["status"]["training"]["valLoss"] == 0.123457
    assert "valLoss" not in PATCH["status"]["training"]


def test_patch_body_has_rfc3339_utc_time_and_no_nan() -> None:
    east = timezone(timedelta(hours=2))
    patch = training_patch(
        epoch=1,
        epochs=1,
        loss=float("nan"),
        val_accuracy=0.5,
        best_val_accuracy=0.5,
        images_per_sec=float("inf"),
        now=datetime(2026, 1, 2, 5, 0, 0, tzinfo=east),
    )
    training = patch["status"]["training"]
    assert training["updatedAt"] == "2026-01-02T03:00:00Z"
    assert training["loss"] is None
    assert training["imagesPerSec"] is None
    json.dumps(patch, allow_nan=False)


def test_a_value_past_the_crds_bounds_is_sent_as_null_or_left_out() -> None:
    """A diverged loss, a rate past 10^15, an estimate past ten years, a stall's words past a
    message's length: the API server would refuse the whole report for one of them."""
    training = training_patch(**{**EPOCH, "loss": -1e20, "images_per_sec": 1e16})["status"][
        "training"
    ]
    training |= position_fields(
        epoch=0, epochs=1, step=1, steps_per_epoch=10, remaining_seconds=1e12
    )
    training["stall"] = stall_fields(None, "rank 3 lags " * 10_000)
    assert (training["loss"], training["imagesPerSec"]) == (None, None)
    assert "estimatedRemainingSeconds" not in training
    assert len(training["stall"]["message"]) == MESSAGE_LENGTH
    TrainingProgress.model_validate(training)


def test_status_url_names_the_status_subresource() -> None:
    assert status_url("https://10.0.0.1:443/", "team-a", "mnist") == (
        "https://10.0.0.1:443" + STATUS_PATH
    )


def test_reporter_is_enabled_only_by_the_operators_env(token_file: Path) -> None:
    job = {"KUBEDDP_JOB_NAME": "mnist", "KUBEDDP_JOB_NAMESPACE": "team-a"}
    assert StatusReporter.from_env({}) is None
    assert StatusReporter.from_env({**job, "KUBEDDP_TOKEN_FILE": str(token_file)}) is None
    missing_token = {**job, "KUBEDDP_API_SERVER": "http://127.0.0.1:1"}
    assert StatusReporter.from_env({**missing_token, "KUBEDDP_TOKEN_FILE": "/nonexistent"}) is None
    in_cluster = {
        **job,
        "KUBERNETES_SERVICE_HOST": "fd00::1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBEDDP_TOKEN_FILE": str(token_file),
    }
    reporter = StatusReporter.from_env(in_cluster)
    assert reporter is not None
    assert reporter.url == "https://[fd00::1]:443" + STATUS_PATH
    # the operator sets the overrides empty in a pod: the in-cluster values stand
    emptied = {**in_cluster, "KUBEDDP_API_SERVER": "", "KUBEDDP_CA_FILE": ""}
    assert getattr(StatusReporter.from_env(emptied), "url", None) == reporter.url
    assert StatusReporter.from_env({**in_cluster, "KUBEDDP_REPORT": "false"}) is None


@pytest.mark.parametrize(
    ("api_server", "sent"),
    [
        ("http://10.0.0.1:6443", False),
        ("http://api.example.com", False),
        ("ftp://127.0.0.1", False),
        ("http://127.0.0.1:6443", True),
        ("http://[::1]:6443", True),
        ("http://localhost:6443", True),
        ("https://api.example.com", True),
    ],
)
def test_the_token_goes_over_https_or_to_loopback_only(
    token_file: Path, api_server: str, sent: bool
) -> None:
    env = {
        "KUBEDDP_JOB_NAME": "mnist",
        "KUBEDDP_JOB_NAMESPACE": "team-a",
        "KUBEDDP_API_SERVER": api_server,
        "KUBEDDP_TOKEN_FILE": str(token_file),
    }
    assert (StatusReporter.from_env(env) is not None) is sent


def test_report_merge_patches_the_status_with_the_current_token(
    api_server: FakeApiServer, token_file: Path
) -> None:
    reporter = StatusReporter(status_url(api_server.url, "team-a", "mnist"), token_file)
    assert reporter.report(PATCH) is True
    token_file.write_text("rotated-token\n")  # projected tokens are refreshed by the kubelet
    assert reporter.report(PATCH) is True

    first, second = api_server.requests
    assert first["path"] == STATUS_PATH
    assert first["headers"]["Content-Type"] == "application/merge-patch+json"
    assert first["headers"]["Authorization"] == "Bearer first-token"
    assert second["headers"]["Authorization"] == "Bearer rotated-token"
    assert first["body"] == PATCH


def test_each_progress_report_names_the_attempt_of_the_pod(
    api_server: FakeApiServer, token_file: Path
) -> None:
    """KUBEDDP_ATTEMPT on status.training: a rank 0 of an earlier attempt, cut off with its
    node but running, is told apart from the current one's."""
    env = {
        "KUBEDDP_JOB_NAME": "mnist",
        "KUBEDDP_JOB_NAMESPACE": "team-a",
        "KUBEDDP_API_SERVER": api_server.url,
        "KUBEDDP_TOKEN_FILE": str(token_file),
        "KUBEDDP_ATTEMPT": "2",
    }
    reporter = StatusReporter.from_env(env)
    assert reporter is not None and reporter.report(PATCH) is True
    assert reporter.report({"status": {"rankRestart": {"count": 1}}}) is True
    training, rank_restart = (r["body"]["status"] for r in api_server.requests)
    assert training["training"] == {**PATCH["status"]["training"], "attempt": 2}
    assert rank_restart == {"rankRestart": {"count": 1}}


def test_failed_reports_back_off_and_never_raise(
    api_server: FakeApiServer, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    reporter = StatusReporter(
        status_url(api_server.url, "team-a", "mnist"), token_file, None, clock
    )
    api_server.statuses = [403, 500]
    with caplog.at_level(logging.WARNING):
        assert reporter.report(PATCH) is False
    assert "HTTP 403" in caplog.text
    assert "injected failure" in caplog.text
    assert len(api_server.requests) == 1

    clock.now += 4.9  # still backing off: no request at all
    assert reporter.report(PATCH) is False
    assert len(api_server.requests) == 1

    clock.now += 0.2  # 5 s after the failure: tried again, fails again, waits twice as long
    assert reporter.report(PATCH) is False
    assert len(api_server.requests) == 2
    clock.now += 9.9
    assert reporter.report(PATCH) is False
    assert len(api_server.requests) == 2

    assert reporter.report(PATCH, final=True) is True  # the last epoch's report is always tried
    assert len(api_server.requests) == 3

    clock.now += 0.2  # the server is back: the report goes through and the backoff resets
    assert reporter.report(PATCH) is True
    assert reporter.report(PATCH) is True
    assert len(api_server.requests) == 5


def test_unreachable_api_server_is_a_warning(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens there
    reporter = StatusReporter(status_url(f"http://127.0.0.1:{port}", "a", "b"), token_file)
    with caplog.at_level(logging.WARNING):
        assert reporter.report(PATCH) is False
    assert "could not report progress" in caplog.text


def test_a_run_reports_every_epoch_and_the_defaults_learn(
    api_server: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    """The defaults (synthetic data, mlp) reach 0.8 within 5 epochs, each one reported."""
    env = support.clean_env(
        KUBEDDP_JOB_NAME="mnist",
        KUBEDDP_JOB_NAMESPACE="team-a",
        KUBEDDP_API_SERVER=api_server.url,
        KUBEDDP_TOKEN_FILE=str(token_file),
    )
    api_server.statuses = [500]  # the first report fails; training goes on, backing off
    run = support.run(support.trainer_command("--epochs=5"), env, cwd=tmp_path).check()
    assert "could not report progress" in run.stderr
    assert run.epochs[-1]["val_accuracy"] >= 0.8

    reported = [request["body"]["status"]["training"] for request in api_server.requests]
    assert (reported[0]["epoch"], reported[0]["step"]) == (0, 1)  # the first step's heartbeat
    assert len(reported) < 5  # epochs end faster than the 5 s backoff
    assert reported[-1]["epoch"] == 5
    assert (reported[-1]["step"], reported[-1]["progressPercentage"]) == (0, 100)
    assert reported[-1]["epochs"] == 5
    assert reported[-1]["valAccuracy"] == pytest.approx(run.epochs[-1]["val_accuracy"], abs=1e-6)
    assert all(request["path"] == STATUS_PATH for request in api_server.requests)


def test_heartbeats_report_the_step_by_time_not_by_step(
    api_server: FakeApiServer, token_file: Path
) -> None:
    """The first step reports (the progress deadline counts from there), then one PATCH per
    interval however many steps pass, with the step, the percentage and the time left."""
    clock = Clock()
    reporter = StatusReporter(status_url(api_server.url, "team-a", "mnist"), token_file)
    heartbeat = Heartbeat(
        reporter, epochs=4, steps_per_epoch=100, world_size=3, every=30, clock=clock
    )
    sent = []
    for step in range(1, 101):  # one step a second through the first epoch
        clock.now += 1
        sent.append(heartbeat.beat(0, step))
    assert [i + 1 for i, beat in enumerate(sent) if beat] == [1, 31, 61, 91]
    assert len(api_server.requests) == 4
    training = api_server.requests[1]["body"]["status"]["training"]
    assert {k: v for k, v in training.items() if k != "updatedAt"} == {
        "epoch": 0,
        "epochs": 4,
        "step": 31,
        "stepsPerEpoch": 100,
        "progressPercentage": 7,
        "estimatedRemainingSeconds": 369,  # 369 steps left at 1 step/s
        "worldSize": 3,  # the ranks training now
    }
    datetime.strptime(training["updatedAt"], "%Y-%m-%dT%H:%M:%SZ")


def test_an_epochs_report_puts_off_the_next_heartbeat(
    api_server: FakeApiServer, token_file: Path
) -> None:
    clock = Clock()
    reporter = StatusReporter(status_url(api_server.url, "team-a", "mnist"), token_file)
    heartbeat = Heartbeat(reporter, epochs=2, steps_per_epoch=10, every=30, clock=clock)
    assert heartbeat.beat(0, 1)
    clock.now += 29
    heartbeat.epoch_report(1)
    clock.now += 29
    assert not heartbeat.beat(1, 1)
    clock.now += 1
    assert heartbeat.beat(1, 2)
    assert heartbeat.position(2, 0)["progressPercentage"] == 100


def test_the_longest_gap_between_reports_is_said_once_an_epoch_ended(
    api_server: FakeApiServer, token_file: Path
) -> None:
    """What the operator learns its progress deadline from: every gap between two reports of
    this process, the end of an epoch (its validation and checkpoint) included; said only once
    an epoch has ended, before which the longest gap is not known."""
    clock = Clock()
    reporter = StatusReporter(status_url(api_server.url, "team-a", "mnist"), token_file)
    heartbeat = Heartbeat(reporter, epochs=3, steps_per_epoch=100, every=30, clock=clock)
    for step in range(1, 101):
        clock.now += 1
        heartbeat.beat(0, step)
    assert all(
        "longestReportGapSeconds" not in r["body"]["status"]["training"]
        for r in api_server.requests
    )
    clock.now += 47  # validation and a checkpoint
    assert heartbeat.epoch_report(1)["longestReportGapSeconds"] == 56.0  # since step 91
    clock.now += 30
    assert heartbeat.beat(1, 1)
    assert api_server.requests[-1]["body"]["status"]["training"]["longestReportGapSeconds"] == 56


def test_a_plain_pytorch_script_reports_with_the_helper_from_rank_0_only(
    api_server: FakeApiServer, token_file: Path
) -> None:
    """manifests/examples/own-script/train.py (not the trainer) under real torchrun, 2 ranks:
    one `report` call per step gives the first step's heartbeat and each epoch's end, from rank
    0 alone (the heartbeat interval is longer than the run)."""
    script = support.REPO / "manifests" / "examples" / "own-script" / "train.py"
    env = support.clean_env(
        KUBEDDP_JOB_NAME="mnist",
        KUBEDDP_JOB_NAMESPACE="team-a",
        KUBEDDP_API_SERVER=api_server.url,
        KUBEDDP_TOKEN_FILE=str(token_file),
    )
    command = [support.TORCHRUN, "--standalone", "--nproc-per-node=2", str(script)]
    run = support.run([*command, "--epochs", "2", "--steps-per-epoch", "50"], env).check()
    assert "done: 100 steps on 2 ranks" in run.stdout

    reported = [request["body"]["status"]["training"] for request in api_server.requests]
    assert [(r["epoch"], r["step"], r["progressPercentage"]) for r in reported] == [
        (0, 1, 1),  # the first step: the progress deadline counts from there
        (1, 0, 50),
        (2, 0, 100),
    ]
    assert all(r["epochs"] == 2 and r["stepsPerEpoch"] == 50 for r in reported)
    assert all(isinstance(r["loss"], float) for r in reported)
    assert reported[-1]["estimatedRemainingSeconds"] == 0
    assert all(request["path"] == STATUS_PATH for request in api_server.requests)


def test_the_helper_does_nothing_outside_kube_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEDDP_JOB_NAME", raising=False)
    progress._heartbeat.cache_clear()
    progress._reporter.cache_clear()
    assert progress.report(0, 1, 10, 0.5, epochs=1) is False
    assert progress.report_checkpoint(10, 0, 0.1) is False


def test_a_saved_checkpoint_is_reported_under_the_names_the_api_has(
    api_server: FakeApiServer, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status.training.checkpoint {step, epoch, savedAt, saveSeconds} and resumedFromStep,
    as the trainer's rank 0 sends them (the same function builds both)."""
    for name, value in {
        "KUBEDDP_JOB_NAME": "mnist",
        "KUBEDDP_JOB_NAMESPACE": "team-a",
        "KUBEDDP_API_SERVER": api_server.url,
        "KUBEDDP_TOKEN_FILE": str(token_file),
        "RANK": "0",
    }.items():
        monkeypatch.setenv(name, value)
    progress._reporter.cache_clear()
    try:
        assert progress.report_checkpoint(1200, 3, 0.4567, resumed_from_step=400)
    finally:
        progress._reporter.cache_clear()
    (request,) = api_server.requests
    training = request["body"]["status"]["training"]
    saved_at = training["checkpoint"].pop("savedAt")
    assert training == {
        "checkpoint": {"step": 1200, "epoch": 3, "saveSeconds": 0.457},
        "resumedFromStep": 400,
    }
    datetime.strptime(saved_at, "%Y-%m-%dT%H:%M:%SZ")


HANGING_SCRIPT = """\
import datetime, time, torch, torch.distributed as dist
from ddp_trainer.progress import report

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
for step in range(1000):
    if step == 20 and dist.get_rank() == 1:
        time.sleep(600)  # hung in its own code
    model(torch.rand(4, 1)).sum().backward()
    report(0, step + 1, 1000, epochs=1)
"""


def test_a_plain_script_with_the_helper_exits_88_naming_the_hung_rank(tmp_path: Path) -> None:
    """A lost peer is not the program's bug: with the helper, a plain script's timed-out
    collective ends it with the trainer's exit code, naming the rank that stopped first."""
    script = tmp_path / "hangs.py"
    script.write_text(HANGING_SCRIPT)
    port = str(free_port())
    envs = [
        support.clean_env(
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            KUBEDDP_JOB_NAME="plain",
            KUBEDDP_JOB_NAMESPACE="team-a",
            KUBEDDP_POD_NAME=f"plain-worker-{rank}",
            KUBEDDP_HEARTBEAT_SECONDS="1",
        )
        for rank in range(2)
    ]
    rank0, rank1 = (support.start([sys.executable, str(script)], env) for env in envs)
    try:
        run = support.finish(rank0)
    finally:
        rank1.kill()
        rank1.wait()
    assert run.returncode == EXIT_PEER_LOST, run.stderr[-3000:]
    assert "rank 1 (pod plain-worker-1, node " in run.stderr, run.stderr[-3000:]
    assert "collective(s) behind the others" in run.stderr
    assert run.stderr.rstrip().endswith("exiting 88 so that the group restarts")


def test_a_loss_straight_from_the_step_is_reported_without_a_warning(
    api_server: FakeApiServer, token_file: Path
) -> None:
    """Users pass `loss` as the step gives it: a tensor with its graph (requires_grad)."""
    import torch

    reporter = StatusReporter(status_url(api_server.url, "team-a", "mine"), token_file)
    heartbeat = Heartbeat(reporter, epochs=1, steps_per_epoch=10, world_size=1, every=30)
    weight = torch.ones(1, requires_grad=True)
    loss = (weight * 0.25).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert heartbeat.beat(0, 1, loss)
    assert api_server.requests[0]["body"]["status"]["training"]["loss"] == 0.25
