"""The pods' commands under the torch each shipped image carries, not only the pinned one.

The trainer image keeps its base's torch (trainer_image/Dockerfile): the CUDA base's, named by
its tag, and Intel Gaudi's, named in the same file's header. Each is installed from PyPI into a
venv of its own (its CUDA libraries load without a GPU; the runs are gloo on the CPU), the
trainer into it as the image installs it (without the [torch] extra), and run as a pod runs it:
`python -m ddp_trainer.torchrun ... -m ddp_trainer`. The venvs stay in the cache
($KUBEDDP_CACHE_DIR/torch/<version>); the trainer is installed again each session.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from ddp_trainer import torch_floor
from ddp_trainer.contract import EXIT_PREEMPTED, RANK_RESTART_FIELD
from kube_ddp.local.plan import free_port
from tests.trainer import support
from tests.trainer.support import FakeApiServer

DOCKERFILE = support.REPO / "trainer_image" / "Dockerfile"
CUDA_BASE_TORCH = r"ARG BASE_IMAGE=pytorch/pytorch:(\d+\.\d+\.\d+)-"
GAUDI_TORCH = r"Intel Gaudi [\d.]+'s images carry torch (\d+\.\d+\.\d+)"
DIGITS = ["--dataset=digits", "--batch-size=32", "--timeout-seconds=60", "--lr=0.05"]


def image_torches(dockerfile: Path = DOCKERFILE) -> dict[str, str]:
    """Each shipped image's torch, as trainer_image/Dockerfile names it."""
    text = dockerfile.read_text()
    found = {
        name: re.search(pattern, text)
        for name, pattern in (("cuda", CUDA_BASE_TORCH), ("gaudi", GAUDI_TORCH))
    }
    assert all(found.values()), f"{dockerfile} no longer names each image's torch: {found}"
    return {name: match.group(1) for name, match in found.items() if match}


IMAGE_TORCHES = image_torches()
VERSIONS = sorted(set(IMAGE_TORCHES.values()))


def test_each_image_torch_is_at_least_the_trainers_floor() -> None:
    for image, version in IMAGE_TORCHES.items():
        assert torch_floor.too_old(version) is None, (image, version)
    assert min(tuple(map(int, v.split(".")[:2])) for v in VERSIONS) == torch_floor.OLDEST


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to install another torch: run the tests through make"
    return uv


@pytest.fixture(scope="module", params=VERSIONS)
def image_python(request: pytest.FixtureRequest) -> str:
    """A python whose torch is `version`, with this tree's trainer installed as the image does."""
    version = request.param
    cache = Path(os.environ.get("KUBEDDP_CACHE_DIR", Path.home() / ".cache" / "kube-ddp"))
    venv = cache / "torch" / version
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    with (venv.parent / f".{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time (two sessions, one cache)
        uv = _uv()
        if not python.exists():
            subprocess.run([uv, "venv", "-q", "--python", "python3", str(venv)], check=True)
        done = subprocess.run(
            [
                uv,
                "pip",
                "install",
                "-q",
                "--python",
                str(python),
                f"torch=={version}",
                "--reinstall-package",
                "ddp-trainer",
                f"{support.REPO / 'trainer_image'}[digits]",
            ],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    said = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert said.stdout.split("+")[0].strip() == version
    return str(python)


def under(python: str, command: list[str]) -> list[str]:
    """`command` (a python command of support's) run by `python`."""
    return [python, *command[1:]]


def test_the_agent_hooks_fit_this_torch(image_python: str) -> None:
    done = subprocess.run(
        [image_python, "-c", "from ddp_trainer import elastic; print(elastic.missing())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_the_pods_command_trains_and_exits_0(image_python: str, tmp_path: Path) -> None:
    command = [
        image_python,
        "-m",
        "ddp_trainer.torchrun",
        "--standalone",
        "--nproc-per-node=1",
        "-m",
        "ddp_trainer",
        "--dataset=synthetic",
        "--synthetic-shape=1x28x28",
        "--model=mlp",
        "--synthetic-samples=2048",
        "--epochs=1",
        f"--checkpoint-dir={tmp_path / 'ck'}",
    ]
    run = support.run(command)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "done: 1 epochs" in run.stderr
    assert "lacks what kube-ddp's agent relies on" not in run.stderr


def test_a_killed_rank_restarts_in_place(
    image_python: str, tmp_path: Path, api_server: FakeApiServer, token_file: Path
) -> None:
    env = support.agent_env("digits-worker-0", api_server, token_file)
    env |= {
        "DDP_TRAINER_CRASH_ONCE_AT_EPOCH": "1",
        "DDP_TRAINER_CRASH_MARKER": str(tmp_path / "crashed"),
    }
    command = support.agent_command(
        "-m",
        "ddp_trainer",
        *DIGITS,
        "--epochs=2",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        port=free_port(),
        nnodes="1",
        host=True,
        nproc=2,
    )
    run = support.run(under(image_python, command), env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ended with 137: restarting in place" in run.stderr
    [restart] = support.patches_of(api_server, RANK_RESTART_FIELD)
    assert restart["exitCode"] == 137
    assert [epoch["epoch"] for epoch in run.epochs][-1] == 2


def test_sigterm_saves_and_the_pod_exits_86(image_python: str, tmp_path: Path) -> None:
    log = tmp_path / "batches"
    command = support.wrapped_torchrun_command(
        "-m", "ddp_trainer", *DIGITS, "--epochs=300", f"--checkpoint-dir={tmp_path / 'ck'}"
    )
    process = support.start(
        under(image_python, command), support.clean_env(DDP_TRAINER_BATCH_LOG=str(log))
    )
    support.wait_for_output(process, r'"epoch": 1,')  # rank 0 trained a whole epoch
    process.send_signal(signal.SIGTERM)
    run = support.finish(process)
    assert run.returncode == EXIT_PREEMPTED, run.stderr[-3000:]
    assert f"every local rank exited {EXIT_PREEMPTED} (preempted, saved)" in run.stderr
    assert sorted((tmp_path / "ck").glob("checkpoint-step-*.pt"))
