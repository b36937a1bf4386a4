"""What a local run checks before any worker starts: the Python packages its workers import,
the user's script (found where the job's pods would have it: beside the job file, as the
ConfigMap the job mounts), and the requests this machine cannot meet (said, not refused: a
local run is a try of the job, sharing what the machine has)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kube_ddp.api import DDPTrainingJob
from kube_ddp.local.plan import LocalRunError, Machine
from kube_ddp.own_command import program, script_of

# The trainer's extras each worker of a job needs: (module, extra).
_TORCH = ("torch", "torch")
_DIGITS = ("sklearn", "digits")


def _python_workers(job: DDPTrainingJob) -> bool:
    """Whether the workers run Python: the trainer, kube-ddp's torchrun, or a command that
    starts python or torchrun (the machine's PATH has this environment's first)."""
    spec = job.spec
    if spec.command is None or spec.procs_per_node > 1 or spec.elastic is not None:
        return True
    name = program(list(spec.command))
    return name.startswith("python") or name == "torchrun" or spec.restarts_in_place


def missing_packages(job: DDPTrainingJob) -> None:
    """Refuse a job whose workers would die on an import this Python cannot do."""
    if not _python_workers(job):
        return
    needed = [_TORCH]
    trainer = job.spec.trainer
    if job.spec.command is None and (trainer is None or trainer.dataset == "digits"):
        needed.append(_DIGITS)
    missing = [(m, extra) for m, extra in needed if importlib.util.find_spec(m) is None]
    if missing:
        modules = " nor ".join(m for m, _ in missing)
        extras = ",".join(extra for _, extra in missing)
        raise LocalRunError(
            f"the workers run this Python ({sys.executable}), which has no {modules}: "
            f"install {'them' if len(missing) > 1 else 'it'} with pip install "
            f"'./trainer_image[{extras}]' from a clone (or pip install "
            f"'ddp-trainer[{extras}]'), or run make venv there"
        )


def workdir(job: DDPTrainingJob, job_dir: Path | None, cwd: Path) -> Path | None:
    """Where the workers run: here, unless the script the command names is only beside the
    job file (None: here). A script found in neither is refused, naming both places."""
    script = script_of([*(job.spec.command or []), *(job.spec.args or [])])
    if script is None or Path(script).is_absolute() or (cwd / script).exists():
        return None
    if job_dir is not None and (job_dir / script).exists():
        return job_dir
    places = [str(cwd)] + ([str(job_dir)] if job_dir is not None and job_dir != cwd else [])
    raise LocalRunError(
        f"spec.command runs {script}, which is not in {' nor in '.join(places)} (the "
        "workers' directory, and the job file's): give its path as the command's, or run from "
        "the directory that holds it"
    )


@dataclass(frozen=True)
class _Need:
    resource: str
    each: str  # as the job writes it
    amount: float  # in the machine's unit: cores, bytes


_SUFFIXES = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]?)")


def quantity(text: str) -> float | None:
    """A Kubernetes quantity as a number (None: not one)."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        return None
    try:
        return float(match.group(1)) * _SUFFIXES[match.group(2)]
    except ValueError:
        return None


def _gib(amount: float) -> str:
    return f"{amount / 2**30:.1f} GiB"


def unmet_requests(job: DDPTrainingJob, machine: Machine, memory_bytes: int) -> str | None:
    """One line naming each cpu or memory request the workers together ask for past what this
    machine has (None: all met)."""
    spec = job.spec
    asked = {**spec.resources.limits, **spec.resources.requests}
    needs = [
        _Need(name, str(asked[name]), value)
        for name in ("cpu", "memory")
        if name in asked and (value := quantity(str(asked[name]))) is not None
    ]
    has = {"cpu": float(machine.cpus), "memory": float(memory_bytes)}
    unmet: Sequence[str] = [
        f"{need.resource} {need.each} a worker x {spec.nodes} (this machine has "
        + (f"{machine.cpus} cores" if need.resource == "cpu" else _gib(memory_bytes))
        + ")"
        for need in needs
        if has[need.resource] and need.amount * spec.nodes > has[need.resource]
    ]
    if not unmet:
        return None
    return (
        f"requests not met here: {'; '.join(unmet)}; the workers run anyway, sharing this "
        "machine (a cluster schedules each pod where its requests fit)"
    )


def memory_bytes() -> int:
    """This machine's memory (0: unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
