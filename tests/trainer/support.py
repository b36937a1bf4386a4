"""Tiny learnable datasets in the published formats, and ways to run the trainer for real."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from kube_ddp.local.plan import free_port

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TORCHRUN = str(VENV_BIN / "torchrun")
# Launcher and operator variables of the shell running the tests must not leak into the runs.
_LAUNCH_PREFIXES = ("OMPI_", "PMI_", "MPI_", "SLURM_", "TORCHELASTIC_", "KUBEDDP_", "DDP_")
_LAUNCH_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"}
_LAUNCH_NAMES |= {"MASTER_PORT", "GROUP_RANK", "KUBERNETES_SERVICE_HOST"}
RUN_TIMEOUT_S = 150


def learnable_images(count: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 grey images whose class is a bright block at a class-specific place, in noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    images = rng.integers(0, 120, (count, size, size)).astype(np.uint8)
    block = size // 4
    for index, label in enumerate(labels):
        row, col = divmod(int(label), 4)
        images[index, row * block : (row + 1) * block, col * block : (col + 1) * block] = 250
    return images, labels.astype(np.uint8)


def striped_images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """3x32x32 uint8 images whose class is a full-width band (row and colour): the label
    survives horizontal flips and small shifts, so --augment keeps it learnable."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    images = rng.integers(0, 120, (count, 3, 32, 32)).astype(np.uint8)
    for index, label in enumerate(labels):
        channel, band = divmod(int(label), 5)
        images[index, channel, band * 6 : band * 6 + 6, :] = 250
    return images, labels.astype(np.uint8)


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: magic 0 0 8 ndim, big-endian sizes, the data."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def write_idx_dataset(directory: Path, train: int = 800, test: int = 200, gz: bool = True) -> Path:
    """An MNIST-format dataset (1x28x28) in `directory`, the four files gzipped or not."""
    directory.mkdir(parents=True, exist_ok=True)
    splits = {"train": learnable_images(train, 28, 1), "t10k": learnable_images(test, 28, 2)}
    for prefix, (images, labels) in splits.items():
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            data = idx_bytes(array)
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                (directory / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (directory / name).write_bytes(data)
    return directory


def write_cifar_batch(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    batch = {
        b"batch_label": path.name.encode(),
        b"labels": [int(label) for label in labels],
        b"data": images.reshape(len(images), -1),
        b"filenames": [f"{i}.png".encode() for i in range(len(images))],
    }
    path.write_bytes(pickle.dumps(batch))


def write_cifar_dataset(directory: Path, per_batch: int = 120, test: int = 200) -> Path:
    """The CIFAR-10 python layout: cifar-10-batches-py/data_batch_1..5 and test_batch."""
    batches = directory / "cifar-10-batches-py"
    batches.mkdir(parents=True, exist_ok=True)
    for number in range(1, 6):
        images, labels = striped_images(per_batch, 10 + number)
        write_cifar_batch(batches / f"data_batch_{number}", images, labels)
    write_cifar_batch(batches / "test_batch", *striped_images(test, 99))
    return directory


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCH_NAMES and not name.startswith(_LAUNCH_PREFIXES)
    }
    env["OMP_NUM_THREADS"] = "1"  # two processes on two cores, as torchrun would set
    env.update(extra)
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def epochs(self) -> list[dict[str, Any]]:
        """The per-epoch JSON lines of rank 0."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    def identities(self) -> set[str]:
        """Each rank's `rank=... node_rank=...` placement, launcher and backend left out."""
        pattern = r"(rank=\d+ world_size=\d+ local_rank=\d+ local_world_size=\d+ node_rank=\d+)"
        return set(re.findall(pattern, self.stderr))

    def check(self) -> Run:
        assert self.returncode == 0, f"exit {self.returncode}\n{self.stdout}\n{self.stderr}"
        return self


def trainer_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddp_trainer", *args]


def torchrun_command(*args: str, nproc: int = 2, max_restarts: int = 0) -> list[str]:
    return [
        TORCHRUN,
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.2",
        "-m",
        "ddp_trainer",
        *args,
    ]


def wrapped_torchrun_command(*args: str, nproc: int = 2) -> list[str]:
    """kube-ddp's torchrun (`python -m ddp_trainer.torchrun`, which exits as its ranks did, the
    pods' command), `nproc` processes of `args` (a script and its arguments, or `-m module`)."""
    return [
        sys.executable,
        "-m",
        "ddp_trainer.torchrun",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.2",
        *args,
    ]


def run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    done = subprocess.run(
        command,
        env=env or clean_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """In a session of its own: `finish` kills what it started (torchrun's ranks too)."""
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen[str]) -> Run:
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        _kill_group(process)
    return Run(process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(process.pid, signal.SIGKILL)
    process.kill()


def wait_for_output(process: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    """Reads `process`'s stdout until `pattern` is found in it, anywhere: ranks share the pipe,
    and a `print` is two writes, so one rank's line can land inside another's. Past
    RUN_TIMEOUT_S, or at the end of the output, the group is killed and the test fails with
    what it printed. What was read is gone from the pipe (and from `finish`'s Run)."""
    assert process.stdout is not None
    descriptor = process.stdout.fileno()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    seen = b""
    while (found := re.search(pattern, seen.decode(errors="replace"))) is None:
        ready, _, _ = select.select([descriptor], [], [], max(deadline - time.monotonic(), 0))
        chunk = os.read(descriptor, 65536) if ready else b""
        if not chunk:
            _kill_group(process)
            stderr = process.communicate(timeout=RUN_TIMEOUT_S)[1]
            why = "timed out" if not ready else f"ended ({process.returncode})"
            raise AssertionError(
                f"{pattern!r} not in the output, {why}\nstdout: {seen.decode()[-2000:]}"
                f"\nstderr: {stderr[-4000:]}"
            )
        seen += chunk
    return found


def summary(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


class FakeApiServer(ThreadingHTTPServer):
    """Records PATCH requests; answers each with the next queued status code (200 when none)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append(
            {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
        )
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        payload = b'{"kind":"Status","message":"injected failure"}' if status >= 400 else b"{}"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass


def agent_command(
    *args: str,
    port: int,
    nnodes: str,
    host: bool,
    nproc: int = 1,
    max_restarts: int = 3,
    rdzv_conf: str = "",
) -> list[str]:
    """One pod's agent as the operator starts it for a job that restarts in place: kube-ddp's
    torchrun with c10d rendezvous at 127.0.0.1:`port` (hosted by the agent with `host`)."""
    return [
        sys.executable,
        "-m",
        "ddp_trainer.torchrun",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=mnist",
        ",".join([f"--rdzv-conf=is_host={str(host).lower()}", *filter(None, [rdzv_conf])]),
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.2",
        *args,
    ]


def agent_env(
    pod: str, api_server: FakeApiServer, token_file: Path, **extra: str
) -> dict[str, str]:
    """A worker pod's environment: its job, pod and node, and the API server to report to."""
    pod_env = {
        "KUBEDDP_JOB_NAME": "mnist",
        "KUBEDDP_JOB_NAMESPACE": "team-a",
        "KUBEDDP_ATTEMPT": "0",
        "KUBEDDP_POD_NAME": pod,
        "KUBEDDP_NODE_NAME": "node-a",
        "KUBEDDP_API_SERVER": api_server.url,
        "KUBEDDP_TOKEN_FILE": str(token_file),
    }
    return clean_env(**{**pod_env, **extra})


def patches_of(api_server: FakeApiServer, field: str) -> list[dict[str, Any]]:
    """The `status.<field>` of every PATCH the server got, in order."""
    bodies = [request["body"].get("status", {}) for request in list(api_server.requests)]
    return [status[field] for status in bodies if field in status]


def two_ranks(**extra: str) -> list[dict[str, str]]:
    """The env of two ranks started by hand, pods hung-worker-<rank>, each writing its progress
    entry every second; `{rank}` in an `extra` value is the rank."""
    port = str(free_port())
    return [
        clean_env(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            KUBEDDP_POD_NAME=f"hung-worker-{rank}",
            KUBEDDP_HEARTBEAT_SECONDS="1",
            **{name: value.format(rank=rank) for name, value in extra.items()},
        )
        for rank in range(2)
    ]


def hung_rank_run(args: list[str], envs: list[dict[str, str]]) -> tuple[Run, str]:
    """The trainer as rank 0 and rank 1 (`two_ranks`' envs), rank 0 run to its end (rank 1
    hangs), then rank 1 killed: rank 0's run, and what rank 1 logged."""
    rank0, rank1 = (start(trainer_command(*args), env) for env in envs)
    try:
        run = finish(rank0)
    finally:
        rank1.kill()
        _, hung_stderr = rank1.communicate()
    return run, hung_stderr
