"""`kube-ddp run --local` without torch: fitting a job to the machine, pods turned into
processes with the pod's env, the progress endpoint, and whole runs of small Python workers
(real processes and signals) decided by the operator's status core."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_trainer import contract
from ddp_trainer.report import StatusReporter, training_patch
from kube_ddp import names
from kube_ddp.builders import worker_env
from kube_ddp.local import preflight
from kube_ddp.local.endpoint import StatusEndpoint
from kube_ddp.local.plan import (
    LOWEST_PORT,
    LocalRunError,
    LocalSettings,
    Machine,
    Overrides,
    fit_job,
    free_port,
    local_state_dir,
    visible_gpus,
    worker_launches,
)
from kube_ddp.local.processes import exit_code_of
from kube_ddp.local.runner import moved_dirs
from tests.unit.support import REPO, job_document, make_job

CPU_ONLY = Machine(gpus=(), cpus=2)
FOUR_GPUS = Machine(gpus=("0", "1", "2", "3"), cpus=16)
KUBE_DDP = [str(Path(sys.executable).parent / "kube-ddp")]
RUN_TIMEOUT_S = 60


def settings(machine: Machine = CPU_ONLY) -> LocalSettings:
    return LocalSettings(machine, "http://127.0.0.1:9", Path("/nonexistent/token"))


# --- fitting a job to this machine ---------------------------------------------------------


def test_a_cpu_job_fits_on_a_free_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job = make_job(nodes=2, port=port, trainer={"dataset": "digits"})
        fitted = fit_job(job, Overrides(), CPU_ONLY)
    assert fitted.spec.port != port
    assert fitted.spec.model_copy(update={"port": port}) == job.spec


def test_the_rendezvous_port_is_below_the_ephemeral_range() -> None:
    """No outgoing connection (a rank's own connect to it included) can take it."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < ephemeral_low for port in ports), ports
    assert len(ports) > 1  # a random start: two runs at once rarely pick the same


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"nodes": 2, "launcher": "mpi"}, "launcher: mpi cannot run locally"),
        ({"nodes": 1, "runPolicy": {"suspend": True}}, "runPolicy.suspend is true"),
        ({"nodes": 1, "accelerator": {"type": "gaudi", "perNode": 8}}, "pass --cpu"),
        (
            {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}},
            "2 workers x 8 nvidia.com/gpu = 16 GPUs and this machine has 4: pass --nodes 1 "
            "--nproc-per-node 4, or --cpu",
        ),
    ],
)
def test_jobs_that_cannot_run_here_say_what_to_pass(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(LocalRunError, match=words.replace(".", r"\.")):
        fit_job(make_job(**spec), Overrides(), FOUR_GPUS)


def test_overrides_fit_a_gpu_job_to_the_machine_or_to_the_cpu() -> None:
    job = make_job(nodes=2, accelerator={"type": "nvidia", "perNode": 8}, backend="nccl")
    fitted = fit_job(job, Overrides(nodes=2, nproc_per_node=2), FOUR_GPUS)
    assert (fitted.spec.nodes, fitted.spec.procs_per_node, fitted.spec.accelerator.per_node) == (
        2,
        2,
        2,
    )
    on_cpu = fit_job(job, Overrides(cpu=True), CPU_ONLY)
    assert (on_cpu.spec.accelerator.type, on_cpu.spec.effective_backend) == ("cpu", "gloo")


def test_overrides_are_validated_like_the_file() -> None:
    job = make_job(nodes=2, elastic={"minNodes": 2, "maxNodes": 4})
    with pytest.raises(LocalRunError, match=r"nodes must lie within elastic\.minNodes"):
        fit_job(job, Overrides(nodes=1), CPU_ONLY)


def test_a_local_run_keeps_the_trainers_absolute_directories_under_its_own_folder(
    tmp_path: Path,
) -> None:
    """No volume is mounted here and /data is rarely writable: the job's absolute dataDir,
    checkpointDir and logDir go under the run's folder, kept between runs; an object store and
    a relative path stay as written, and the run says what moved."""
    trainer = {
        "dataset": "mnist",
        "dataDir": "/data",
        "checkpointDir": "s3://bucket/run",
        "logDir": "/mnt/logs/run-1",
    }
    job = make_job(nodes=2, trainer=trainer)
    state = local_state_dir(job, {"XDG_CACHE_HOME": str(tmp_path)})
    assert state == tmp_path / "kube-ddp" / "local" / job.namespace / job.name
    fitted = fit_job(job, Overrides(), CPU_ONLY, state)
    assert fitted.spec.trainer is not None
    assert fitted.spec.trainer.data_dir == str(state / "data")
    assert fitted.spec.trainer.checkpoint_dir == "s3://bucket/run"
    assert fitted.spec.trainer.log_dir == str(state / "mnt" / "logs" / "run-1")
    assert moved_dirs(job, fitted) == [
        f"dataDir /data -> {state / 'data'} (here, not the cluster's volume)",
        f"logDir /mnt/logs/run-1 -> {state / 'mnt/logs/run-1'} (here, not the cluster's volume)",
    ]
    relative = make_job(nodes=2, trainer={"dataset": "mnist", "dataDir": "datasets"})
    assert moved_dirs(relative, fit_job(relative, Overrides(), CPU_ONLY, state)) == []


# --- pods as processes -----------------------------------------------------------------------


def test_a_torchrun_pod_runs_its_command_with_the_env_contract(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Launcher variables of the calling shell must not reach the workers.
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    recreated = make_job(nodes=2, nprocPerNode=2, trainer={"epochs": 1}, runPolicy=RECREATE)
    job = fit_job(recreated, Overrides(), CPU_ONLY)
    port = str(job.spec.port)
    first, second = worker_launches(job, 0, (0, 1), settings())
    assert second.argv == [
        *contract.TORCHRUN_COMMAND,
        "--nnodes=2",
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "-m",
        "ddp_trainer",
        "--epochs",
        "1",
    ]
    master = names.master_addr(job.name, job.namespace)
    for launch in (first, second):
        built = {e["name"]: e["value"] for e in worker_env(job, launch.index, 0) if "value" in e}
        assert built["MASTER_ADDR"] == master
        # Every variable of the contract, as the builders set it; only the address is local,
        # and the downward API's pod and node are this process's pod and this machine.
        pod = f"{job.name}-worker-{launch.index}"
        where = {"KUBEDDP_POD_NAME": pod, "KUBEDDP_NODE_NAME": socket.gethostname()}
        assert launch.pod_env == {
            **{k: v.replace(master, "127.0.0.1") for k, v in built.items()},
            **where,
        }
        built |= where
        # the reporter's overrides, empty in a pod, point at this machine's endpoint
        overrides = set(contract.REPORTER_ENV)
        assert {k: launch.env[k] for k in built.keys() - overrides} == {
            k: v for k, v in launch.pod_env.items() if k not in overrides
        }
        assert launch.env["KUBEDDP_API_SERVER"].startswith("http://127.0.0.1:")
        assert launch.env["CUDA_VISIBLE_DEVICES"] == ""  # a cpu pod sees no GPU
        assert launch.env["OMP_NUM_THREADS"] == "1"  # 2 cores shared by 4 processes
        assert launch.env["PATH"].startswith(str(Path(sys.executable).parent) + os.pathsep)
        assert "RANK" not in launch.env
        assert "SLURM_PROCID" not in launch.env and "TORCHELASTIC_RUN_ID" not in launch.env
    assert (first.pod_env["NODE_RANK"], second.pod_env["NODE_RANK"]) == ("0", "1")
    assert second.pod_env["WORLD_SIZE"] == "4"


def test_the_users_env_is_expanded_as_the_kubelet_does() -> None:
    spec = {
        "nodes": 2,
        "runPolicy": RECREATE,
        "command": ["sh", "-c", "echo $(ENDPOINT) $$(NODE_RANK) $(UNDEFINED)"],
        "env": [
            {"name": "ENDPOINT", "value": "tcp://$(MASTER_ADDR):$(MASTER_PORT)/$(NODE_RANK)"},
            {"name": "PEER", "value": "bar-worker-1.bar.ns1.svc.cluster.local:80"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "INDEX", "valueFrom": {"fieldRef": {"fieldPath": REPLICA_LABEL_PATH}}},
        ],
    }
    job = fit_job(make_job(**spec), Overrides(), CPU_ONLY)
    launch = worker_launches(job, 0, (1,), settings())[0]
    endpoint = f"tcp://127.0.0.1:{job.spec.port}/1"
    assert launch.argv == ["sh", "-c", f"echo {endpoint} $(NODE_RANK) $(UNDEFINED)"]
    assert launch.env["ENDPOINT"] == endpoint
    assert launch.env["PEER"] == "127.0.0.1:80"  # every worker's DNS name is this machine
    assert (launch.env["POD"], launch.env["INDEX"]) == ("bar-worker-1", "1")


REPLICA_LABEL_PATH = f"metadata.labels['{names.LABEL_REPLICA_INDEX}']"


def test_a_secret_has_no_local_value() -> None:
    secret = {"secretKeyRef": {"name": "s3", "key": "token"}}
    job = fit_job(
        make_job(nodes=1, env=[{"name": "TOKEN", "valueFrom": secret}]), Overrides(), CPU_ONLY
    )
    with pytest.raises(LocalRunError, match=r"spec\.env TOKEN: valueFrom .*secretKeyRef"):
        worker_launches(job, 0, (0,), settings())


def test_each_gpu_pod_gets_its_own_devices() -> None:
    job = fit_job(
        make_job(nodes=2, accelerator={"type": "nvidia", "perNode": 2}), Overrides(), FOUR_GPUS
    )
    launches = worker_launches(job, 3, (0, 1), settings(FOUR_GPUS))
    assert [launch.env["CUDA_VISIBLE_DEVICES"] for launch in launches] == ["0,1", "2,3"]
    assert [launch.attempt for launch in launches] == [3, 3]
    assert launches[0].env["OMP_NUM_THREADS"] == "4"


@pytest.mark.parametrize(
    ("visible", "gpus"),
    [("0,2", ("0", "2")), ("", ()), (" 1 , ", ("1",)), ("GPU-8f3a", ("GPU-8f3a",))],
)
def test_cuda_visible_devices_says_which_gpus_there_are(
    visible: str, gpus: tuple[str, ...]
) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": visible}) == gpus


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (-9, 137), (-15, 143)])
def test_a_signal_is_an_exit_code_above_128(returncode: int, code: int) -> None:
    assert exit_code_of(returncode) == code


# --- progress: the trainer's own reporter against the runner's endpoint -------------------


def test_the_trainers_reporter_patches_the_local_endpoint(tmp_path: Path) -> None:
    job = make_job(nodes=2)
    with StatusEndpoint(job, tmp_path) as endpoint:
        env = {
            "KUBEDDP_JOB_NAME": job.name,
            "KUBEDDP_JOB_NAMESPACE": job.namespace,
            "KUBEDDP_API_SERVER": endpoint.url,
            "KUBEDDP_TOKEN_FILE": str(endpoint.token_file),
        }
        reporter = StatusReporter.from_env(env)
        assert reporter is not None
        patch = training_patch(
            epoch=3,
            epochs=12,
            loss=0.25,
            val_accuracy=0.9,
            best_val_accuracy=0.91,
            images_per_sec=1234.5,
            now=datetime.now(UTC),
        )
        assert reporter.report(patch)
        progress = endpoint.progress()
        assert progress is not None
        assert (progress.epoch, progress.val_accuracy, progress.images_per_sec) == (3, 0.9, 1234.5)

        other_job = StatusReporter.from_env({**env, "KUBEDDP_JOB_NAME": "other"})
        assert other_job is not None and not other_job.report(patch, final=True)  # 404
        (tmp_path / "stolen").write_text("not-the-token")
        wrong_token = StatusReporter.from_env(
            {**env, "KUBEDDP_TOKEN_FILE": str(tmp_path / "stolen")}
        )
        assert wrong_token is not None and not wrong_token.report(patch, final=True)  # 401
        assert endpoint.reports == 1


# --- whole runs of small Python workers --------------------------------------------------


def write_job(tmp_path: Path, spec: dict[str, Any], name: str = "bar") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job_document(spec, name=name)))
    return path


# The group path: every worker recreated on a restart (restarts in place are the default)
RECREATE = {"restartStrategy": "Recreate"}


def python_workers(script: str, nodes: int = 2, **spec: Any) -> dict[str, Any]:
    """A job whose workers run `script` (env: NODE_RANK, KUBEDDP_ATTEMPT, OUT), restarted as a
    group unless `runPolicy` says otherwise."""
    spec["runPolicy"] = {**RECREATE, **spec.get("runPolicy", {})}
    return {"nodes": nodes, "command": ["python", "-c", script], **spec}


def run_cli(
    *args: str, timeout: float = RUN_TIMEOUT_S, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`kube-ddp *args`; one still running after `timeout` is stopped as a SIGTERM stops a
    local run, its workers with it (a SIGKILL, subprocess.run's, would leave them running),
    and the test fails."""
    argv = [*KUBE_DDP, *args]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.communicate(timeout=60)
            raise
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def out_env(tmp_path: Path) -> list[dict[str, str]]:
    return [{"name": "OUT", "value": str(tmp_path)}]


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody reaps (PID 1 does not, here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_success_of_worker_0_completes_the_job_and_stops_the_rest(tmp_path: Path) -> None:
    script = (
        "import os, sys, time; from pathlib import Path\n"
        "Path(os.environ['OUT'], 'pid-' + os.environ['NODE_RANK']).write_text(str(os.getpid()))\n"
        "if os.environ['NODE_RANK'] == '0':\n"
        "    time.sleep(1); print('rank 0 done'); sys.exit(0)\n"
        "time.sleep(600)\n"
    )
    job = write_job(tmp_path, python_workers(script, env=out_env(tmp_path)))
    done = run_cli("run", "--local", str(job))
    assert done.returncode == 0, done.stderr
    assert "[worker-0] rank 0 done" in done.stdout
    assert "Normal WorkerSucceeded: bar-worker-0 completed" in done.stderr
    assert "phase         Succeeded" in done.stderr
    rows = [line.split() for line in done.stderr.splitlines() if line.startswith("bar-worker-")]
    assert [(r[0], r[3], r[4]) for r in rows] == [
        ("bar-worker-0", "0", "Completed"),
        ("bar-worker-1", "143", "stopped"),  # cleanPodPolicy Running: SIGTERM after the grace
    ]
    assert not alive(int((tmp_path / "pid-1").read_text()))


def test_a_peer_that_ends_just_after_worker_0_completes_too(tmp_path: Path) -> None:
    """Ranks past the last step end a moment apart: the later one is not stopped."""
    script = "import os, sys, time\ntime.sleep(1 if os.environ['NODE_RANK'] == '0' else 3)\n"
    done = run_cli("run", "--local", str(write_job(tmp_path, python_workers(script))))
    assert done.returncode == 0, done.stderr
    assert "stopping" not in done.stderr
    rows = [line.split() for line in done.stderr.splitlines() if line.startswith("bar-worker-")]
    assert [(r[0], r[3], r[4]) for r in rows] == [
        ("bar-worker-0", "0", "Completed"),
        ("bar-worker-1", "0", "Completed"),
    ]


def test_a_finished_job_stops_its_workers_even_with_clean_pod_policy_none(
    tmp_path: Path,
) -> None:
    """In a cluster such pods run on; a local run ends with its job and leaves nothing."""
    script = (
        "import os, sys, time; from pathlib import Path\n"
        "Path(os.environ['OUT'], 'pid-' + os.environ['NODE_RANK']).write_text(str(os.getpid()))\n"
        "time.sleep(0.5 if os.environ['NODE_RANK'] == '0' else 600)\n"
    )
    spec = python_workers(script, env=out_env(tmp_path), runPolicy={"cleanPodPolicy": "None"})
    done = run_cli("run", "--local", str(write_job(tmp_path, spec)))
    assert done.returncode == 0, done.stderr
    assert "kube-ddp: stopping bar-worker-1: the job has finished" in done.stderr
    assert not alive(int((tmp_path / "pid-1").read_text()))


def test_a_non_retryable_exit_fails_the_job_with_the_first_failure(tmp_path: Path) -> None:
    script = (
        "import os, sys, time\n"
        "if os.environ['NODE_RANK'] == '1':\n"
        "    print('bad input', file=sys.stderr); sys.exit(3)\n"
        "time.sleep(600)\n"
    )
    done = run_cli("run", "--local", str(write_job(tmp_path, python_workers(script))))
    assert done.returncode == 1, done.stderr
    assert "[worker-1] bad input" in done.stdout
    assert "Warning NonRetryableExitCode: bar-worker-1 exited with code 3" in done.stderr
    # its last line, as a cluster's pod gives it (terminationMessagePolicy FallbackToLogsOnError)
    assert "message       bar-worker-1 exited with code 3 (Error: bad input); " in done.stderr
    assert "failure       bar-worker-1 exit 3 (Error)" in done.stderr


def test_a_script_beside_the_job_file_is_run_there(tmp_path: Path) -> None:
    """The job's pods have its script where a volume mounts it; here it is beside the job
    file, which the user may run from anywhere (the README's examples are run from the root)."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("import os; print('ran in', os.getcwd())\n")
    job = write_job(tmp_path / "jobs", {"nodes": 1, "command": ["python", "train.py"]})
    done = run_cli("run", "--local", "jobs/bar.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"kube-ddp: the workers run in {job.parent}, beside the job file" in done.stderr
    assert f"[worker-0] ran in {job.parent}" in done.stdout


def test_a_script_in_neither_place_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    write_job(tmp_path / "jobs", {"nodes": 2, "command": ["python", "-u", "train.py"]})
    done = run_cli("run", "--local", "jobs/bar.yaml", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"jobs/bar.yaml: spec.command runs train.py, which is not in {tmp_path} nor "
        f"in {tmp_path / 'jobs'} (the workers' directory, and the job file's): give its path "
        "as the command's, or run from the directory that holds it\n"
    )


def test_requests_this_machine_cannot_meet_are_said_in_one_line(tmp_path: Path) -> None:
    spec = {
        "nodes": 2,
        "command": ["python", "-c", "pass"],
        "resources": {"requests": {"cpu": "1000", "memory": "250Ti"}, "limits": {"cpu": "1200"}},
        "runPolicy": RECREATE,
    }
    done = run_cli("run", "--local", str(write_job(tmp_path, spec)))
    assert done.returncode == 0, done.stderr
    (said,) = [line for line in done.stderr.splitlines() if "requests not met" in line]
    cores = Machine.detect(os.environ).cpus
    assert said.startswith(
        f"kube-ddp: requests not met here: cpu 1000 a worker x 2 (this machine has {cores} "
        "cores); memory 250Ti a worker x 2 (this machine has "
    )
    assert said.endswith(
        "GiB); the workers run anyway, sharing this machine (a cluster "
        "schedules each pod where its requests fit)"
    )


def test_a_killed_worker_restarts_the_group(tmp_path: Path) -> None:
    """Attempt 0: worker 1 is killed by SIGKILL (137, retryable); the whole group is
    recreated as attempt 1 with KUBEDDP_ATTEMPT=1, which succeeds."""
    script = (
        "import os, signal, sys, time\n"
        "attempt, rank = os.environ['KUBEDDP_ATTEMPT'], os.environ['NODE_RANK']\n"
        "print(f'attempt {attempt}')\n"
        "if attempt == '0' and rank == '1':\n"
        "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(600 if attempt == '0' else 1 if rank == '0' else 0)\n"
    )
    done = run_cli("run", "--local", str(write_job(tmp_path, python_workers(script))))
    assert done.returncode == 0, done.stderr
    assert (
        "Warning WorkerFailed: bar-worker-1 exited with code 137 (Error: attempt 0); restarting "
        "the group "
        "(restart 1 of at most 3)"
    ) in done.stderr
    assert done.stdout.count("attempt 0") == 2 and done.stdout.count("attempt 1") == 2
    rows = [line.split() for line in done.stderr.splitlines() if line.startswith("bar-worker-")]
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("bar-worker-0", "0", "143"),  # stopped for the restart
        ("bar-worker-1", "0", "137"),
        ("bar-worker-0", "1", "0"),
        ("bar-worker-1", "1", "0"),
    ]
    assert "restarts      1" in done.stderr


def test_backoff_limit_then_failed(tmp_path: Path) -> None:
    script = "import os, signal, time\ntime.sleep(0.3)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    spec = python_workers(script, nodes=1, runPolicy={"backoffLimit": 1})
    done = run_cli("run", "--local", str(write_job(tmp_path, spec)))
    assert done.returncode == 1, done.stderr
    assert "restart 1 of at most 1" in done.stderr
    assert "Warning BackoffLimitExceeded: bar-worker-0 exited with code 137" in done.stderr


def test_active_deadline_stops_the_workers(tmp_path: Path) -> None:
    spec = python_workers("import time; time.sleep(600)", runPolicy={"activeDeadlineSeconds": 1})
    started = time.monotonic()
    done = run_cli("run", "--local", "--grace-period=2", str(write_job(tmp_path, spec)))
    assert done.returncode == 1, done.stderr
    assert "Warning DeadlineExceeded: The job ran longer than activeDeadlineSeconds (1s)" in (
        done.stderr
    )
    assert time.monotonic() - started < 20


def test_logs_go_to_files_per_pod_and_attempt(tmp_path: Path) -> None:
    script = "import os; print('hello from', os.environ['NODE_RANK'])"
    logs = tmp_path / "logs"
    done = run_cli(
        "run", "--local", f"--logs={logs}", str(write_job(tmp_path, python_workers(script)))
    )
    assert done.returncode == 0, done.stderr
    assert "[worker-" not in done.stdout
    assert (logs / "bar-worker-0-attempt-0.log").read_text() == "hello from 0\n"


@pytest.fixture
def interrupted_run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A run whose workers each start a grandchild, all sleeping; ended by the test."""
    script = (
        "import os, subprocess, time; from pathlib import Path\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        "out = Path(os.environ['OUT'])\n"
        "(out / ('pids-' + os.environ['NODE_RANK'])).write_text(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(600)\n"
    )
    job = write_job(tmp_path, python_workers(script, env=out_env(tmp_path)))
    process = subprocess.Popen(
        [*KUBE_DDP, "run", "--local", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield process, tmp_path
    process.kill()
    process.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_every_process_it_started(
    interrupted_run: tuple[subprocess.Popen[str], Path], signum: signal.Signals
) -> None:
    process, out = interrupted_run
    deadline = time.monotonic() + 30
    pid_files = [out / "pids-0", out / "pids-1"]
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
    pids = [int(pid) for f in pid_files for pid in f.read_text().split()]
    assert all(alive(pid) for pid in pids)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert "interrupted: SIGTERM to every worker" in stderr
    assert "stopped every worker process it started (bar-worker-0 (pid" in stderr
    assert "Traceback" not in stderr
    assert [pid for pid in pids if alive(pid)] == []  # workers and their children


@pytest.mark.parametrize(
    ("args", "spec", "words"),
    [
        ((), {"nodes": 0}, "bar.yaml:7:3: spec.nodes: Input should be greater than or equal to 1"),
        ((), {"nodes": 1, "replicas": 2}, "bar.yaml:8:3: spec.replicas: unknown field"),
        (("--nodes=0",), {"nodes": 1}, "--nodes must be at least 1, got 0"),
        ((), {"nodes": 1, "launcher": "mpi"}, "launcher: mpi cannot run locally"),
        (
            ("--nodes=3",),
            {"nodes": 2, "elastic": {"minNodes": 1, "maxNodes": 2}},
            "with the command-line overrides: spec: nodes must lie within",
        ),
    ],
)
def test_an_invalid_file_or_option_exits_2_naming_the_problem(
    tmp_path: Path, args: tuple[str, ...], spec: dict[str, Any], words: str
) -> None:
    done = run_cli("run", "--local", *args, str(write_job(tmp_path, spec)))
    assert done.returncode == 2
    assert words in done.stderr
    assert "Traceback" not in done.stderr


def test_python_m_kube_ddp_cli_exits_2_too(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kube_ddp.cli", "run", "--local", str(write_job(tmp_path, {}))],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert (done.returncode, done.stderr) == (
        2,
        f"{tmp_path / 'bar.yaml'}:6:1: spec.nodes: required field is missing\n",
    )


def test_run_without_local_says_how_to_run_on_a_cluster() -> None:
    done = run_cli("run", str(REPO / "manifests/examples/digits-cpu.yaml"))
    assert done.returncode == 2
    assert "pass --local" in done.stderr and "kubectl apply -f" in done.stderr


@pytest.mark.trainer  # torchrun's agents, one per pod
def test_a_lost_worker_of_a_job_that_restarts_in_place_is_replaced_alone(tmp_path: Path) -> None:
    """Each pod runs the agent (ddp_trainer.torchrun, c10d rendezvous on worker 0's store).
    Worker 1's agent dies by SIGKILL (its pod lost): only worker 1 is created again, under the
    same attempt; worker 0 and its agent keep running and take the replacement in (its ranks
    re-rendezvous), and the job ends when worker 0's rank sees the replacement (torchrun's
    agents leave together: an exit barrier)."""
    script = (
        "import os, signal, time; from pathlib import Path\n"
        "out, pod = Path(os.environ['OUT']), os.environ['KUBEDDP_POD_NAME']\n"
        "if '-worker-1' in pod:\n"
        "    first = not (out / 'lost').exists()\n"
        "    (out / ('replaced', 'lost')[first]).write_text(str(os.getppid()))\n"
        "    if first:\n"
        "        agent = os.getppid(); os.kill(agent, signal.SIGKILL)\n"
        "        while os.getppid() == agent: time.sleep(0.05)\n"
        "        raise SystemExit(0)  # its agent is gone: nothing is left to wait for\n"
        "    while not (out / 'worker-0-saw-it').exists(): time.sleep(0.1)\n"
        "    raise SystemExit(0)\n"
        "(out / 'agent-0').write_text(str(os.getppid()))\n"
        "while not (out / 'replaced').exists(): time.sleep(0.1)\n"
        "(out / 'worker-0-saw-it').write_text(os.environ['KUBEDDP_ATTEMPT'])\n"
    )
    spec = python_workers(script, env=out_env(tmp_path), runPolicy={"restartStrategy": "InPlace"})
    done = run_cli("run", "--local", str(write_job(tmp_path, spec)))
    assert done.returncode == 0, done.stderr
    assert "Warning WorkerReplaced: bar-worker-1 exited with code 137" in done.stderr
    assert "restart 1 of at most 3" in done.stderr
    rows = [line.split() for line in done.stderr.splitlines() if line.startswith("bar-worker-")]
    # worker 0 never stopped: one process all along; worker 1's replacement, the same attempt,
    # ends with it or is stopped once the job has ended
    assert [(r[0], r[1], r[3]) for r in rows[:2]] == [
        ("bar-worker-0", "0", "0"),
        ("bar-worker-1", "0", "137"),
    ]
    assert (rows[2][0], rows[2][1], rows[2][3] in ("0", "143")) == ("bar-worker-1-r1", "0", True)
    assert len(rows) == 3
    assert (tmp_path / "worker-0-saw-it").read_text() == "0"
    assert (tmp_path / "lost").read_text() != (tmp_path / "replaced").read_text()
    assert "restarts      1" in done.stderr


@pytest.mark.trainer  # torchrun's agents, one per pod
def test_a_killed_rank_restarts_in_place_and_is_counted(tmp_path: Path) -> None:
    """A rank of worker 1 is SIGKILLed (137, retryable): its agent restarts it in place, worker
    0's agent follows (the group re-forms), the agent reports it to the runner's endpoint, and
    the runner counts it: one restart, RestartedInPlace, every worker one process all along."""
    script = (
        "import os, signal, time; from pathlib import Path\n"
        "out, pod = Path(os.environ['OUT']), os.environ['KUBEDDP_POD_NAME']\n"
        "if '-worker-1' in pod:\n"
        "    if not (out / 'crashed').exists():\n"
        "        (out / 'crashed').write_text(''); os.kill(os.getpid(), signal.SIGKILL)\n"
        "    (out / 'again').write_text(''); raise SystemExit(0)\n"
        "while not (out / 'again').exists(): time.sleep(0.1)\n"
    )
    spec = python_workers(script, env=out_env(tmp_path), runPolicy={"restartStrategy": "InPlace"})
    done = run_cli("run", "--local", str(write_job(tmp_path, spec)))
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "Warning RestartedInPlace" in line]
    assert len(said) == 1 and "(pod bar-worker-1) exited with code 137" in said[0], said
    rows = [line.split() for line in done.stderr.splitlines() if line.startswith("bar-worker-")]
    # one process each all along (worker 1 ends with worker 0 or is stopped once the job ended)
    assert [(r[0], r[1], r[3] in ("0", "143")) for r in rows] == [
        ("bar-worker-0", "0", True),
        ("bar-worker-1", "0", True),
    ]
    assert "restarts      1" in done.stderr


def test_processes_a_worker_started_in_sessions_of_their_own_go_with_it(tmp_path: Path) -> None:
    """As torchrun's ranks are: a worker starts a child in a session of its own that ignores
    SIGTERM, and waits for it (an agent waiting for a hung rank). Ctrl-C: the worker is killed
    at the end of the grace period, and its child with it, not left running."""
    script = (
        "import os, subprocess, sys; from pathlib import Path\n"
        "hang = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(600)'\n"
        "child = subprocess.Popen([sys.executable, '-c', hang], start_new_session=True)\n"
        "out = Path(os.environ['OUT']) / ('child-' + os.environ['NODE_RANK'])\n"
        "out.write_text(str(child.pid))\n"
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); child.wait()\n"
    )
    job = write_job(tmp_path, python_workers(script, env=out_env(tmp_path)))
    process = subprocess.Popen(
        [*KUBE_DDP, "run", "--local", "--grace-period=1", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children: list[int] = []
    try:
        files = [tmp_path / "child-0", tmp_path / "child-1"]
        deadline = time.monotonic() + 30
        while not all(f.exists() and f.read_text() for f in files):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        children = [int(f.read_text()) for f in files]
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 130, stderr
        assert [pid for pid in children if alive(pid)] == []
    finally:
        process.kill()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_run_ends_with_its_curve_one_line_across_a_restart(tmp_path: Path) -> None:
    """Rank 0 reports epochs 1 to 3 at once (each a point, though the runner looks once),
    its peer is killed, and the group resumed at epoch 3 trains it again and epoch 4: one
    curve over epochs 1 to 4, the restart marked at epoch 3, and the PNG written."""
    script = (
        "import os, signal, sys, time\n"
        "from datetime import UTC, datetime\n"
        "from pathlib import Path\n"
        "from ddp_trainer.report import StatusReporter, training_patch\n"
        "attempt, rank = os.environ['KUBEDDP_ATTEMPT'], os.environ['NODE_RANK']\n"
        "reported = Path(os.environ['OUT'], 'reported')\n"
        "def epoch(e, loss):\n"
        "    patch = training_patch(epoch=e, epochs=4, loss=loss, val_loss=loss + 0.1,\n"
        "        val_accuracy=0.5 + e / 10, best_val_accuracy=0.5 + e / 10,\n"
        "        images_per_sec=100.0, now=datetime.now(UTC))\n"
        "    patch['status']['training'].update(step=0, stepsPerEpoch=10)\n"
        "    assert StatusReporter.from_env(os.environ).report(patch)\n"
        "if attempt == '0' and rank == '0':\n"
        "    [epoch(e, 1.0 / e) for e in (1, 2, 3)]; reported.touch(); time.sleep(600)\n"
        "if attempt == '0':\n"
        "    while not reported.exists(): time.sleep(0.05)\n"
        "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
        "if rank == '0':\n"
        "    [epoch(e, 0.9 / e) for e in (3, 4)]\n"
    )
    job = write_job(tmp_path, python_workers(script, env=out_env(tmp_path)))
    png = tmp_path / "curve.png"
    done = run_cli("run", "--local", "--plot", str(png), str(job))
    assert done.returncode == 0, done.stderr
    curve = done.stderr.split("\nCurve:\n", 1)[1].split("\nkube-ddp: wrote")[0].splitlines()
    assert "ns1/bar" in curve[0]
    assert curve[-2].split() == ["loss", "epoch", "val-acc"]
    ticks = curve[-3].split()
    assert (float(ticks[0]), float(ticks[-1])) == (1, 4)
    assert curve[-1].strip().split("   ") == [
        "• loss",
        "x val-loss",
        "+ val-acc (right)",
        "┃ restart (3)",
    ]
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert f"kube-ddp: wrote the training curve to {png}" in done.stderr


def test_a_run_with_no_epoch_says_there_is_no_curve(tmp_path: Path) -> None:
    job = write_job(tmp_path, python_workers("print('no epochs')", nodes=1))
    done = run_cli("run", "--local", str(job))
    assert done.returncode == 0, done.stderr
    assert done.stderr.rstrip().endswith("Curve:        no epoch has ended yet")


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("500m", 0.5), ("1.5", 1.5), ("4Gi", 4 * 2**30), ("250G", 250e9), ("1e3", 1000)],
)
def test_a_request_is_read_as_kubernetes_writes_quantities(text: str, value: float) -> None:
    assert preflight.quantity(text) == pytest.approx(value)
    assert preflight.quantity(f"{text} cores") is None
