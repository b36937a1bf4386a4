"""`kube-ddp run --local` of real training jobs: the operator's pods as processes, wired by
the env contract, training with gloo on the bundled digits, reporting progress to the runner."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ddp_trainer.contract import EXIT_CONFIG, EXIT_PREEMPTED
from tests.trainer import support

KUBE_DDP = str(Path(sys.executable).parent / "kube-ddp")
DIGITS = {"dataset": "digits", "model": "mlp", "batchSize": 32, "timeoutSeconds": 60}


def run_job(tmp_path: Path, spec: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    document = {
        "apiVersion": "kubeddp.io/v1alpha1",
        "kind": "DDPTrainingJob",
        "metadata": {"name": "digits"},
        "spec": spec,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return subprocess.run(
        [KUBE_DDP, "run", "--local", *args, str(path)],
        env=support.clean_env(),
        capture_output=True,
        text=True,
        timeout=support.RUN_TIMEOUT_S,
        check=False,
    )


def start_run(path: Path) -> subprocess.Popen[str]:
    """`kube-ddp run --local` of the job file `path`, its output piped, left running."""
    return subprocess.Popen(
        [KUBE_DDP, "run", "--local", str(path)],
        env=support.clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def epochs_of_rank_0(stdout: str) -> list[dict[str, Any]]:
    prefix = "[worker-0] {"
    return [
        json.loads(line[len("[worker-0] ") :])
        for line in stdout.splitlines()
        if line.startswith(prefix)
    ]


def placements(stdout: str) -> set[str]:
    return set(
        re.findall(
            r"rank=\d+ world_size=\d+ local_rank=\d+ local_world_size=\d+ node_rank=\d+", stdout
        )
    )


def summary_value(stderr: str, key: str) -> str:
    return next(
        line[len(key) :].strip() for line in stderr.splitlines() if line.startswith(key + " ")
    )


def test_two_workers_of_one_process_train_to_succeeded(tmp_path: Path) -> None:
    png = tmp_path / "curve.png"
    done = run_job(
        tmp_path,
        {
            "nodes": 2,
            "trainer": {**DIGITS, "epochs": 2},
            "runPolicy": {"restartStrategy": "Recreate"},
        },
        "--plot",
        str(png),
    )
    assert done.returncode == 0, done.stderr
    assert placements(done.stdout) == {
        "rank=0 world_size=2 local_rank=0 local_world_size=1 node_rank=0",
        "rank=1 world_size=2 local_rank=0 local_world_size=1 node_rank=1",
    }
    assert "launcher=env backend=gloo device=cpu" in done.stdout
    assert [epoch["epoch"] for epoch in epochs_of_rank_0(done.stdout)] == [1, 2]
    assert summary_value(done.stderr, "phase") == "Succeeded"
    # Progress came through the trainer's reporter to the runner's endpoint.
    assert summary_value(done.stderr, "epochs") == "2/2"
    last = epochs_of_rank_0(done.stdout)[-1]
    assert summary_value(done.stderr, "val-acc") == f"{last['val_accuracy']:.4f}"
    # The run ends with its curve: both epochs, each with loss, val-loss and val-acc.
    curve = done.stderr.split("\nCurve:\n", 1)[1].split("\nkube-ddp: wrote")[0].splitlines()
    assert curve[0].strip() == "default/digits"
    ticks = curve[-3].split()
    assert (float(ticks[0]), float(ticks[-1])) == (1, 2)
    assert curve[-1].strip().split("   ") == ["• loss", "x val-loss", "+ val-acc (right)"]
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_two_workers_of_two_processes_under_torchrun(tmp_path: Path) -> None:
    done = run_job(tmp_path, {"nodes": 2, "nprocPerNode": 2, "trainer": {**DIGITS, "epochs": 1}})
    assert done.returncode == 0, done.stderr
    assert "digits-worker-1 (pid" in done.stderr and "torchrun --nnodes=2" in done.stderr
    assert placements(done.stdout) == {
        f"rank={rank} world_size=4 local_rank={rank % 2} local_world_size=2 node_rank={rank // 2}"
        for rank in range(4)
    }
    assert "launcher=torchrun backend=gloo" in done.stdout
    assert summary_value(done.stderr, "phase") == "Succeeded"


def test_a_killed_worker_restarts_the_group_which_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    crash = [
        {"name": "DDP_TRAINER_CRASH_ONCE_AT_EPOCH", "value": "1"},
        {"name": "DDP_TRAINER_CRASH_MARKER", "value": str(tmp_path / "crashed")},
    ]
    trainer = {**DIGITS, "epochs": 3, "checkpointDir": str(tmp_path / "checkpoints")}
    job = {
        "nodes": 2,
        "trainer": trainer,
        "env": crash,
        "runPolicy": {"restartStrategy": "Recreate"},
    }
    done = run_job(tmp_path, job)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "crashed").exists()
    assert_restarted_for(done.stderr, "digits-worker-1 exited with code 137")
    # Attempt 0 trained epoch 1 and was killed; attempt 1 resumed at epoch 2.
    assert [epoch["epoch"] for epoch in epochs_of_rank_0(done.stdout)] == [1, 2, 3]
    assert summary_value(done.stderr, "restarts") == "1", done.stderr  # says why a second
    assert summary_value(done.stderr, "phase") == "Succeeded"


def test_under_torchrun_a_killed_rank_restarts_the_group_a_missing_dataset_fails_it(
    tmp_path: Path,
) -> None:
    """torchrun exits 1 whatever ended a rank; the pod exits as the rank did: 137 for one
    SIGKILLed (a group restart), the trainer's own 78 for data that is not there (the job
    fails fast, saying which code)."""
    crash = [
        {"name": "DDP_TRAINER_CRASH_ONCE_AT_EPOCH", "value": "1"},
        {"name": "DDP_TRAINER_CRASH_MARKER", "value": str(tmp_path / "crashed")},
    ]
    trainer = {**DIGITS, "epochs": 2, "checkpointDir": str(tmp_path / "checkpoints")}
    job = {
        "nodes": 1,
        "nprocPerNode": 2,
        "trainer": trainer,
        "env": crash,
        "runPolicy": {"restartStrategy": "Recreate"},
    }
    done = run_job(tmp_path, job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_restarted_for(done.stderr, "digits-worker-0 exited with code 137")
    assert summary_value(done.stderr, "phase") == "Succeeded"

    missing = {**DIGITS, "dataset": "mnist", "dataDir": str(tmp_path / "no-data")}
    failed = run_job(tmp_path, {"nodes": 1, "nprocPerNode": 2, "trainer": missing})
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert summary_value(failed.stderr, "phase") == "Failed"
    assert f"digits-worker-0 exited with code {EXIT_CONFIG}" in failed.stderr
    assert "NonRetryableExitCode" in failed.stderr


def test_a_hung_rank_is_named_by_its_pod_and_its_peer_ends_retryable(tmp_path: Path) -> None:
    """Worker 1 hangs in its own code after epoch 1: worker 0's collective times out, it exits
    88 (a group restart: here none left) and names worker 1's pod, from the downward API."""
    hang = [
        {"name": "DDP_TRAINER_HANG_AT_EPOCH", "value": "1"},
        {"name": "KUBEDDP_HEARTBEAT_SECONDS", "value": "1"},
    ]
    trainer = {**DIGITS, "epochs": 50, "timeoutSeconds": 12}
    spec = {"nodes": 2, "trainer": trainer, "env": hang, "runPolicy": {"backoffLimit": 0}}
    done = run_job(tmp_path, spec)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "digits-worker-0 exited with code 88" in done.stderr
    assert "BackoffLimitExceeded" in done.stderr  # retryable, but no restarts left
    said = re.search(
        r"\[worker-0\] .*(rank 1 \(pod digits-worker-1, node [^)]+\) stopped .*)", done.stdout
    )
    assert said, done.stdout[-3000:]
    assert "collective(s) behind the others" in said.group(1)
    assert "[worker-1] ddp_trainer[rank 1]: no step for" in done.stdout


def test_the_demo_job_reaches_its_target_printing_the_readme_s_transcript() -> None:
    """`make demo`: the example file as it is, two workers to the target accuracy, saying each
    line of the README's transcript, numbers aside, in its order."""
    example = support.REPO / "manifests" / "examples" / "digits-cpu.yaml"
    done = subprocess.run(
        [KUBE_DDP, "run", "--local", str(example)],
        env=support.clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # as a terminal shows them, interleaved
        text=True,
        timeout=support.RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert summary_value(done.stdout, "phase") == "Succeeded"
    assert float(summary_value(done.stdout, "best val-acc")) >= 0.98
    said = done.stdout.splitlines()
    at = 0
    for line in readme_transcript():
        pattern = transcript_pattern(line)
        found = next((i for i in range(at, len(said)) if pattern.fullmatch(said[i])), None)
        rows = [s for s in said if s.startswith("digits-worker-")]
        assert found is not None, (
            f"the README's line, not printed after line {at}:\n{line}\nthe workers' rows:\n"
            + "\n".join(rows)
        )
        at = found + 1


def readme_transcript() -> list[str]:
    readme = (support.REPO / "README.md").read_text()
    block = readme.split("```console\n$ make demo\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line not in ("", "...")]


def transcript_pattern(line: str) -> re.Pattern[str]:
    """The line with any number standing for any other, and any run of spaces for another."""
    number, spaces = r"\d+(?:\.\d+)?", r" +"
    parts = re.split(f"({number}|{spaces})", line)
    return re.compile(
        "".join(
            number if part[:1].isdigit() else spaces if part[:1] == " " else re.escape(part)
            for part in parts
        )
    )


def assert_restarted_for(said: str, what: str) -> None:
    """A WorkerFailed event for `what`, with the pod's last line (its termination message),
    that restarted the group."""
    (event,) = [line for line in said.splitlines() if f"Warning WorkerFailed: {what}" in line]
    assert event.split(what, 1)[1].startswith(" (Error: "), event
    assert "; restarting the group" in event, event


def run_example(
    name: str, *flags: str, cache: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`kube-ddp run --local manifests/examples/<name>/job.yaml` from the repository's root, as
    its comment says; it must succeed (no retry: a rank of a script that aborted in the
    interpreter's teardown after its last step is what `ddp_trainer.script` prevents)."""
    done = subprocess.run(
        [KUBE_DDP, "run", "--local", *flags, f"manifests/examples/{name}/job.yaml"],
        cwd=support.REPO,
        # a run keeps its checkpoints under the cache (to resume): a test's own starts anew
        env=support.clean_env(**({"XDG_CACHE_HOME": str(cache)} if cache else {})),
        capture_output=True,
        text=True,
        timeout=support.RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_own_script_example_runs_under_torchrun_started_by_kube_ddp() -> None:
    """manifests/examples/own-script as shipped, from the repository's root (the job names
    `train.py`, a plain PyTorch script beside it, found there): 2 pods x 2 processes, each with
    its rank from the torchrun kube-ddp put in front of `python train.py`."""
    done = run_example("own-script")
    example = support.REPO / "manifests" / "examples" / "own-script"
    assert f"kube-ddp: the workers run in {example}, beside the job file" in done.stderr
    ranks = set(re.findall(r"rank (\d) of 4 \(local rank (\d)\)", done.stdout))
    assert ranks == {("0", "0"), ("1", "1"), ("2", "0"), ("3", "1")}
    assert "done: 200 steps on 4 ranks" in done.stdout
    assert summary_value(done.stderr, "phase") == "Succeeded"
    assert summary_value(done.stderr, "epochs") == "2/2"  # its one `report` line


def test_the_slurm_examples_job_runs_as_its_sbatch_script_would(tmp_path: Path) -> None:
    """manifests/examples/slurm/job.yaml, the sbatch example's job: one pod of two tasks, all
    its epochs (its checkpoints in a cache of the test's own: none from an earlier run)."""
    done = run_example("slurm", cache=tmp_path)
    assert "1 workers x 2 processes" in done.stderr
    assert summary_value(done.stderr, "phase") == "Succeeded"
    assert summary_value(done.stderr, "epochs") == "10/10"


def test_the_mp_spawn_example_runs_as_written_one_process_spawning_its_ranks() -> None:
    """manifests/examples/mp-spawn as shipped (the tutorial's script, unchanged), on the CPU:
    the pod's one process spawns its own ranks (2 without a GPU), under its own MASTER_ADDR."""
    done = run_example("mp-spawn", "--cpu")
    assert "1 workers x 1 process" in done.stderr
    assert set(re.findall(r"rank (\d) of (\d):", done.stdout)) == {("0", "2"), ("1", "2")}
    assert summary_value(done.stderr, "phase") == "Succeeded"


def test_ctrl_c_saves_a_checkpoint_and_the_next_run_resumes_from_it(tmp_path: Path) -> None:
    """Ctrl-C to `kube-ddp run --local`: its workers get SIGTERM, as a suspended job's pods
    do, agree on a step, save it and exit 86; the runner says where; the same command again
    resumes there."""
    trainer = {**DIGITS, "epochs": 300, "checkpointDir": str(tmp_path / "checkpoints")}
    document = {
        "apiVersion": "kubeddp.io/v1alpha1",
        "kind": "DDPTrainingJob",
        "metadata": {"name": "digits"},
        "spec": {"nodes": 2, "trainer": trainer},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))

    def interrupted_once(started_when: str) -> tuple[str, str, str]:
        """Run the job, Ctrl-C once a line of its output holds `started_when`."""
        runner = start_run(path)
        assert runner.stdout is not None
        seen = next((line for line in runner.stdout if started_when in line), "")
        runner.send_signal(signal.SIGINT)
        try:
            rest, stderr = runner.communicate(timeout=support.RUN_TIMEOUT_S)
        finally:
            runner.kill()
        assert runner.returncode == 130, stderr[-3000:]
        return seen, rest, stderr

    _, _, stderr = interrupted_once("[worker-0] {")  # after its first epoch
    said = re.search(r"the job stopped with a checkpoint at step (\d+): running it again", stderr)
    assert said, stderr[-3000:]
    step = int(said.group(1))
    assert step > 0
    for worker in ("digits-worker-0", "digits-worker-1"):  # the summary's table
        assert re.search(rf"{worker}\s+0\s+\d+\s+{EXIT_PREEMPTED}\s+stopped", stderr), stderr

    resumed, _, _ = interrupted_once("resuming at step")
    assert f"resuming at step {step} " in resumed, resumed


def test_an_elastic_job_loses_a_worker_and_trains_on_to_the_end(tmp_path: Path) -> None:
    """3 workers, `elastic: {minNodes: 2, maxNodes: 3}`: worker 2's pod (its agent and rank)
    is SIGKILLed mid-run. Worker 2 alone is created again, the group re-forms (at 2, or at 3
    when the replacement is there within the last call, as it is here at once) and trains on
    from where it was (no epoch trained twice, the loss still falling), and the job succeeds
    with that one restart."""
    steps = tmp_path / "steps"
    trainer = {**DIGITS, "epochs": 8, "checkpointDir": str(tmp_path / "checkpoints")}
    trainer["checkpointEverySteps"] = 5
    document = {
        "apiVersion": "kubeddp.io/v1alpha1",
        "kind": "DDPTrainingJob",
        "metadata": {"name": "digits"},
        "spec": {
            "nodes": 3,
            "elastic": {"minNodes": 2, "maxNodes": 3},
            "trainer": trainer,
            "env": [{"name": "DDP_TRAINER_BATCH_LOG", "value": str(steps)}],
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    runner = start_run(path)
    try:
        trained = Path(f"{steps}.rank0")
        deadline = time.monotonic() + support.RUN_TIMEOUT_S
        while len(trained.read_text().splitlines() if trained.exists() else []) < 20:
            assert runner.poll() is None and time.monotonic() < deadline, "never trained"
            time.sleep(0.1)
        for pid in _pod_processes("digits-worker-2"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stdout, stderr = runner.communicate(timeout=support.RUN_TIMEOUT_S)
    finally:
        runner.kill()
    assert runner.returncode == 0, stderr[-3000:]
    assert "Warning WorkerReplaced: digits-worker-2 " in stderr, stderr[-3000:]
    epochs = epochs_of_rank_0(stdout)
    assert [epoch["epoch"] for epoch in epochs] == list(range(1, 9))  # none trained twice
    assert epochs[-1]["val_loss"] < epochs[0]["val_loss"]
    assert summary_value(stderr, "restarts") == "1"
    assert summary_value(stderr, "phase") == "Succeeded"


def _pod_processes(pod: str) -> list[int]:
    """The local pod `pod`'s processes: its agent (KUBEDDP_POD_NAME in its environment) and
    every process below it."""
    agents = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if f"KUBEDDP_POD_NAME={pod}".encode() in environ.read_bytes().split(b"\0"):
                agents.append(int(environ.parent.name))
    found, unseen = [], [min(agents)] if agents else []
    while unseen:
        pid = unseen.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                unseen.extend(int(child) for child in task.read_text().split())
    assert found, f"no process of {pod}"
    return found


def test_the_torchrun_tutorials_example_runs_its_torchvision_script_as_written() -> None:
    """manifests/examples/torchrun-tutorial: the tutorial's ResNet-18 script (torchvision's
    models, transforms and datasets) under the torchrun kube-ddp starts, 2 pods x 2 ranks, on
    the CPU (its 2 GPUs a pod kept as 2 processes)."""
    done = run_example("torchrun-tutorial", "--cpu")
    assert "2 workers x 2 processes" in done.stderr
    said = set(re.findall(r"rank (\d) epoch 1 loss", done.stdout))
    assert said == {"0", "1", "2", "3"}, done.stdout[-2000:]
    assert summary_value(done.stderr, "phase") == "Succeeded"
