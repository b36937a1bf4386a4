"""The CLI on a user's machine: `pip install ./trainer_image ./operator` into a fresh venv, as
the README says, installs `kube-ddp` and `kubectl-ddp` without torch, and `render` and
`run --local`'s checks work there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.trainer import support

REPO = support.REPO


def test_the_cli_installs_from_the_repository_without_torch(tmp_path: Path) -> None:
    venv = tmp_path / "cli"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    uv = os.environ.get("UV")
    # The README's pip line; uv (the Makefile's) takes the same arguments and its warm cache.
    install = (
        [uv, "pip", "install", "--python", str(venv / "bin" / "python3")]
        if uv
        else [str(venv / "bin" / "python3"), "-m", "pip", "install", "--quiet"]
    )
    done = subprocess.run(
        [*install, str(REPO / "trainer_image"), str(REPO / "operator")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for script in ("kube-ddp", "kubectl-ddp"):
        assert (venv / "bin" / script).is_file(), script
    python = str(venv / "bin" / "python3")  # its scripts run by it: a host command of BASE
    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    assert no_torch.returncode != 0  # the trainer's torch is an extra the CLI does not take
    job = REPO / "manifests" / "examples" / "digits-cpu.yaml"
    rendered = subprocess.run(
        [python, str(venv / "bin" / "kube-ddp"), "render", str(job)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert "kind: Pod" in rendered.stdout
    assert "ddp-trainer:0.1.0-cpu" in rendered.stderr  # the CPU image, named by render
    # run --local there: refused before any worker starts, with the line that installs torch
    local = subprocess.run(
        [python, str(venv / "bin" / "kube-ddp"), "run", "--local", str(job)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (local.returncode, local.stdout) == (2, ""), local.stderr
    assert local.stderr == (
        f"{job}: the workers run this Python ({python}), which has no torch nor sklearn: "
        "install them with pip install './trainer_image[torch,digits]' from a clone (or pip "
        "install 'ddp-trainer[torch,digits]'), or run make venv there\n"
    )
