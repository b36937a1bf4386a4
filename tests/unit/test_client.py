"""The Python client where no cluster is needed: what `import kube_ddp` loads, the job
docs/python-client.md builds, and `run_local` of a job object (real processes, no torch).
Against the API server: tests/cluster/test_client.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

import kube_ddp
from kube_ddp.api import DDPTrainingJobSpec, RunPolicy
from kube_ddp.client import TrainerClient, new_job, run_local
from tests.unit.support import REPO

NOTEBOOK = REPO / "docs" / "python-client.md"


def test_the_operator_s_imports_of_the_package_load_no_client() -> None:
    """names.py imports the package (its version): the client, kopf's login and aiohttp's
    session are loaded only by a name exported from it."""
    script = (
        "import sys, kube_ddp.names\n"
        "assert 'kube_ddp.client' not in sys.modules\n"
        "from kube_ddp import TrainerClient\n"
        "assert 'kube_ddp.client' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_every_exported_name_resolves() -> None:
    assert all(getattr(kube_ddp, name) is not None for name in kube_ddp.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        _ = kube_ddp.Nope


def test_the_notebook_s_job_is_the_quick_start_s() -> None:
    first = re.findall(r"^```python\n(.*?)^```", NOTEBOOK.read_text(), re.M | re.S)[0]
    notebook: dict[str, object] = {}
    exec(first.split("client = TrainerClient(")[0], notebook)
    job = notebook["job"]
    assert isinstance(job, kube_ddp.DDPTrainingJob)
    example = yaml.safe_load((REPO / "manifests/examples/digits-cpu.yaml").read_text())
    sent = job.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"status"})
    assert sent == {**example, "metadata": {"name": "digits"}}


def test_a_wait_for_a_phase_that_does_not_exist_says_which_do() -> None:
    client = TrainerClient(namespace="ns1", kubeconfig="/nonexistent")  # no call made
    try:
        with pytest.raises(ValueError, match=r"phases among Pending, .*, got \['Complete'\]"):
            client.wait_for_job_status("bar", {"Complete"})  # Kubeflow's name for Succeeded
    finally:
        client.close()


def test_run_local_runs_the_job_object_here(capsys: pytest.CaptureFixture[str]) -> None:
    script = "import os; print('worker', os.environ['NODE_RANK'], 'of', os.environ['NNODES'])"
    spec = DDPTrainingJobSpec(
        nodes=2,
        command=[sys.executable, "-c", script],
        run_policy=RunPolicy(restart_strategy="Recreate"),
    )
    assert run_local(new_job("bar", spec)) == 0
    out, err = capsys.readouterr()
    assert "[worker-0] worker 0 of 2" in out
    assert "phase         Succeeded" in err
