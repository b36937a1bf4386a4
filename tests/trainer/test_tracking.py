"""Training curves where people look: the real trainer under torchrun (2 processes, gloo)
writing TensorBoard event files and to a real MLflow tracking server, killed mid-run and
resumed from its checkpoint; the curves read back with TensorBoard's own reader and MLflow's
client: one line, one run, no step twice."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import event_pb2

from ddp_trainer.contract import EXIT_PREEMPTED
from kube_ddp.local.plan import free_port
from tests import mlflow_server
from tests.mlflow_server import NO_TELEMETRY, running_mlflow_server
from tests.s3_server import S3Server, running_s3_server
from tests.trainer import support

# digits: 1,437 training samples, 2 ranks of 64 a step: 12 steps an epoch.
STEPS_PER_EPOCH = 12
TINY = ["--dataset=digits", "--model=mlp", "--batch-size=64", "--timeout-seconds=60"]
JOB = {"KUBEDDP_JOB_NAME": "digits", "KUBEDDP_JOB_NAMESPACE": "team-a"}


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def scalar_steps(accumulator: EventAccumulator, tag: str) -> list[int]:
    return [event.step for event in accumulator.Scalars(tag)]


def file_events(path: Path) -> list[event_pb2.Event]:
    return list(EventFileLoader(str(path)).Load())


def scalars_in(events: list[event_pb2.Event], tag: str) -> list[int]:
    return [e.step for e in events for value in e.summary.value if value.tag == tag]


def test_a_run_killed_after_its_checkpoint_resumes_the_same_curves_and_mlflow_run(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """Rank 1 is killed after step 6, two steps past the checkpoint at step 4, so rank 0 has
    logged steps 5 and 6 already; the run that resumes from step 4 trains them again. One
    TensorBoard line and one MLflow run come out, each step once."""
    log_dir, checkpoints = tmp_path / "logs", tmp_path / "checkpoints"
    command = support.torchrun_command(
        *TINY,
        "--epochs=2",
        f"--log-dir={log_dir}",
        "--log-every-steps=1",
        f"--checkpoint-dir={checkpoints}",
        "--checkpoint-every-steps=4",
    )
    env = support.clean_env(
        **JOB,
        **NO_TELEMETRY,
        MLFLOW_TRACKING_URI=mlflow_uri,
        DDP_TRAINER_CRASH_ONCE_AT_STEP="6",
        DDP_TRAINER_CRASH_MARKER=str(tmp_path / "crashed"),
    )
    killed = support.run(command, env)
    assert killed.returncode != 0, killed.stderr[-3000:]
    (first,) = mlflow_server.runs(mlflow_uri)
    assert first["status"] != "FINISHED"
    killed_steps = [step for step, _ in first["metrics"]["train/loss"]]
    assert killed_steps == [1, 2, 3, 4, 5, 6]  # past the checkpoint: what the resume redoes

    resumed = support.run(command, env).check()
    assert "resuming at step 4" in resumed.stderr
    total = 2 * STEPS_PER_EPOCH

    # TensorBoard, as its reader shows the directory: one line, each step once.
    (killed_file, resumed_file) = sorted(log_dir.glob("events.out.tfevents.*"))
    assert scalars_in(file_events(killed_file), "train/loss") == [1, 2, 3, 4, 5, 6]
    start = next(e for e in file_events(resumed_file) if e.HasField("session_log"))
    assert (start.session_log.status, start.step) == (event_pb2.SessionLog.START, 5)
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    assert scalar_steps(accumulator, "train/loss") == list(range(1, total + 1))
    assert scalar_steps(accumulator, "epoch/val_accuracy") == [STEPS_PER_EPOCH, total]
    for tag in ("train/lr", "train/images_per_sec", "train/step_seconds", "epoch/val_loss"):
        assert accumulator.Scalars(tag), tag

    # MLflow: the same run continued and finished, each step once, going forward.
    (run,) = mlflow_server.runs(mlflow_uri)
    assert run["run_id"] == first["run_id"]
    assert run["status"] == "FINISHED"
    assert run["tags"]["kubeddp.io/job-name"] == "digits"
    assert run["tags"]["kubeddp.io/job-namespace"] == "team-a"
    final = checkpoints / f"checkpoint-step-{total:010d}.pt"
    assert run["tags"]["kubeddp.io/checkpoint"] == str(final)
    assert run["params"]["world_size"] == "2"
    assert run["params"]["accelerator"] == "cpu"
    assert run["params"]["batch_size"] == "64"
    assert [step for step, _ in run["metrics"]["train/loss"]] == list(range(1, total + 1))
    epochs = run["metrics"]["epoch/val_accuracy"]
    assert [step for step, _ in epochs] == [STEPS_PER_EPOCH, total]
    assert epochs[-1][1] > 0.5  # digits learns


def test_event_files_in_an_object_store_read_by_tensorboard_from_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--log-dir s3://...: the events go through the checkpoints' store; TensorBoard's own S3
    reader (boto3 at S3_ENDPOINT) reads them from the bucket, across a resume."""
    with running_s3_server(tmp_path / "s3") as s3:
        bucket = s3.create_bucket()
        args = [
            *TINY,
            f"--log-dir=s3://{bucket}/digits/logs",
            "--log-every-steps=4",
            f"--checkpoint-dir=s3://{bucket}/digits/checkpoints",
        ]
        env = support.clean_env(**s3.env())
        support.run(support.torchrun_command(*args, "--epochs=1"), env).check()
        support.run(support.torchrun_command(*args, "--epochs=2"), env).check()
        accumulator = _read_s3_logs(s3, f"s3://{bucket}/digits/logs", monkeypatch)
    assert scalar_steps(accumulator, "train/loss") == [4, 8, 12, 16, 20, 24]
    assert scalar_steps(accumulator, "epoch/val_accuracy") == [12, 24]


def _read_s3_logs(s3: S3Server, uri: str, monkeypatch: pytest.MonkeyPatch) -> EventAccumulator:
    for name, value in {**s3.env(), "S3_ENDPOINT": s3.endpoint}.items():
        monkeypatch.setenv(name, value)
    accumulator = EventAccumulator(uri)
    accumulator.Reload()
    return accumulator


def test_the_own_script_example_resumed_after_sigterm_draws_one_line(tmp_path: Path) -> None:
    """manifests/examples/own-script/train.py (plain PyTorch, `log_metrics` every 10 steps)
    under kube-ddp's torchrun: stopped by SIGTERM (exit 86, its last events written on the
    way out), then run to its end from the checkpoint: one line, every 10th step once."""
    log_dir, checkpoints = tmp_path / "logs", tmp_path / "checkpoints"
    script = support.REPO / "manifests" / "examples" / "own-script" / "train.py"
    args = [str(script), f"--checkpoint-dir={checkpoints}", f"--log-dir={log_dir}"]
    process = support.start(
        support.wrapped_torchrun_command(*args, "--epochs=10000"), support.clean_env()
    )
    deadline = time.monotonic() + support.RUN_TIMEOUT_S
    while not any(log_dir.glob("events.*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # rank 0 logged step 10: its writer is open
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    stopped = support.finish(process)
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-2000:]
    step = int(re.findall(r"stopping after step (\d+)", stopped.stdout)[0])
    epochs = step // 100 + 2  # 100 steps an epoch: past the stop
    support.run(support.wrapped_torchrun_command(*args, f"--epochs={epochs}")).check()

    files = sorted(log_dir.glob("events.out.tfevents.*"))
    assert len(files) == 2
    assert scalars_in(file_events(files[0]), "loss")[-1] == step // 10 * 10
    start = next(e for e in file_events(files[1]) if e.HasField("session_log"))
    assert start.step == step + 1  # what the stopped run logged stays
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    assert scalar_steps(accumulator, "loss") == list(range(10, epochs * 100 + 1, 10))


def test_writers_that_cannot_write_never_stop_training(tmp_path: Path) -> None:
    """No tracking server at the URI and a log dir that is a file: two warnings, and the run
    trains to its end as without them. The URI's credentials are in no line."""
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    summary = tmp_path / "summary.json"
    uri = f"http://alice:s3cret@127.0.0.1:{free_port()}"
    env = support.clean_env(**NO_TELEMETRY, MLFLOW_TRACKING_URI=uri)
    done = support.run(
        support.trainer_command(
            *TINY, "--epochs=1", f"--log-dir={not_a_directory}", f"--summary-file={summary}"
        ),
        env,
    ).check()
    assert f"not writing TensorBoard events to {not_a_directory}" in done.stderr
    assert "not logging to MLflow at http://***@127.0.0.1:" in done.stderr
    assert "s3cret" not in done.stdout + done.stderr
    assert support.summary(summary)["epochs_run"] == 1


def test_a_run_without_a_log_dir_or_tracking_server_imports_neither(tmp_path: Path) -> None:
    """The operator's image and a job that asks for no curves never load their packages."""
    probe = (
        "import sys\n"
        "from ddp_trainer.options import parse_argv\n"
        "from ddp_trainer.train import run\n"
        f"run(parse_argv({[*TINY, '--epochs=1']!r}))\n"
        "import kube_ddp.cli\n"
        "print(sorted(m for m in ('tensorboard', 'mlflow') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=support.clean_env(),
        capture_output=True,
        text=True,
        timeout=support.RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "[]"
