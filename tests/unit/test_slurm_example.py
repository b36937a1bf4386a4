"""manifests/examples/slurm: the sbatch script and its job file say the same job, read as
docs/mpi.md's table maps one to the other."""

from __future__ import annotations

import itertools
import re
import shlex

import yaml

from kube_ddp.api import load_job
from tests.unit.support import REPO

SLURM = REPO / "manifests" / "examples" / "slurm"


def sbatch_settings() -> dict[str, str]:
    text = (SLURM / "ddp.sbatch").read_text()
    return dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", text, flags=re.M))


def srun_trainer_flags() -> dict[str, str]:
    """The trainer's flags on the srun line, with the script's defaults for its variables."""
    text = (SLURM / "ddp.sbatch").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("srun ")]
    words = shlex.split(re.sub(r'"\$\{[A-Z_]+:-([^}]*)\}"', r"\1", line))
    flags = words[words.index("ddp_trainer") + 1 :]
    return {
        flag.removeprefix("--"): value
        for flag, value in itertools.pairwise(flags)
        if flag.startswith("--")
    }


def test_the_job_file_is_the_sbatch_scripts_job() -> None:
    job = load_job(yaml.safe_load((SLURM / "job.yaml").read_text()))
    sbatch = sbatch_settings()
    assert job.name == sbatch["job-name"]
    assert job.spec.nodes == int(sbatch["nodes"])
    assert job.spec.procs_per_node == int(sbatch["ntasks-per-node"])
    trainer = srun_trainer_flags()
    assert job.spec.trainer is not None
    assert job.spec.trainer.dataset == trainer["dataset"]
    assert job.spec.trainer.epochs == int(trainer["epochs"])
    assert "checkpoint-dir" in trainer and job.spec.trainer.checkpoint_dir is not None
