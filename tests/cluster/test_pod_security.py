"""A hardened cluster: namespaces labelled `pod-security.kubernetes.io/enforce`, where the API
server's built-in PodSecurity admission refuses pods that do not meet the level.

- `kube-ddp render --pod-security LEVEL` gives the server's verdict for every pod of every
  example in manifests/examples/: each pod render prints goes to the server as a dry run in a
  namespace enforcing LEVEL, and both must refuse it for the same reasons, or both admit it.
- In a `restricted` namespace a torchrun job and an MPI job run (kwok nodes); a Gaudi job's
  pods (host IPC, SYS_NICE) are refused by the server.
"""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_ddp import cli, podsecurity
from tests.cluster.operator_support import Jobs, OperatorProcess, job_manifest
from tests.cluster.support import (
    REFUSED,
    Cluster,
    enforce,
    fresh_namespace,
    server_refusal,
    wait_for,
)
from tests.cluster.test_mpi import CPU_MPI, condition, running_launcher

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p
    for p in (REPO / "manifests" / "examples").rglob("*.yaml")
    if "kind: DDPTrainingJob" in p.read_text()
)


@pytest.fixture
def restricted(cluster: Cluster, namespace: str) -> str:
    enforce(cluster, namespace, "restricted")
    return namespace


@pytest.fixture(scope="module")
def levels(cluster: Cluster) -> Iterator[dict[podsecurity.Level, str]]:
    """One namespace enforcing each level, for the whole module."""
    with contextlib.ExitStack() as stack:
        made: dict[podsecurity.Level, str] = {}
        for level in podsecurity.LEVELS:
            fresh = fresh_namespace(cluster, f"pss-{level}-{uuid.uuid4().hex[:5]}")
            name = stack.enter_context(fresh)
            enforce(cluster, name, level)
            made[level] = name
        yield made


def reasons_in(message: str) -> set[str]:
    """The reasons of a PodSecurity refusal: `...: reason (detail), reason (detail)`."""
    listed = re.split(rf'{REFUSED} "[^"]*": ', message, maxsplit=1)[-1]
    found, depth, word = set(), 0, ""
    for char in listed:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char == ",":
            found.add(word.strip())
            word = ""
        elif depth == 0 and char not in "()":
            word += char
        elif depth == 1 and char == "(":
            found.add(word.strip())
            word = ""
    return {w for w in found | {word.strip()} if w}


def render_check(example: Path, level: str) -> tuple[int, str]:
    """`kube-ddp render FILE --pod-security LEVEL`: its exit code and what it said."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["render", str(example), "--pod-security", level])
    return code, err.getvalue()


def rendered_pods(example: Path) -> list[podsecurity.RenderedPod]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["render", str(example)]) == 0
    return podsecurity.rendered_pods([d for d in yaml.safe_load_all(out.getvalue()) if d])


def as_pod(pod: podsecurity.RenderedPod) -> dict[str, Any]:
    """The pod for a dry run: its ServiceAccount (which the operator creates first) left out,
    as the ServiceAccount admission would refuse a missing one before PodSecurity looks."""
    spec = {k: v for k, v in pod.spec.items() if k != "serviceAccountName"}
    metadata = {k: v for k, v in pod.metadata.items() if k != "namespace"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**metadata, "name": pod.name},
            "spec": spec}  # fmt: skip


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_render_gives_the_servers_verdict_on_every_example(
    cluster: Cluster, levels: dict[podsecurity.Level, str], example: Path
) -> None:
    for level, namespace in levels.items():
        said = render_check(example, level)[1]
        for pod in rendered_pods(example):
            server = server_refusal(cluster, namespace, as_pod(pod))
            ours = f"{pod.name} {REFUSED}" in said
            assert ours == (server is not None), (level, pod.name, server, said)
            expected = {v.reason for v in podsecurity.violations(pod.metadata, pod.spec, level)}
            assert reasons_in(server or "") == expected, (level, pod.name, server)


def test_a_torchrun_job_runs_in_a_restricted_namespace(
    cluster: Cluster, restricted: str, crd: None, operator: OperatorProcess
) -> None:
    jobs = Jobs(cluster, restricted)
    jobs.create(job_manifest("digits", nodes=2))
    jobs.wait_pods("digits", 2)
    jobs.end_worker("digits-worker-0", 0)
    assert jobs.wait_phase("digits", "Succeeded")["restarts"] == 0


@pytest.mark.usefixtures("mpi_operator")
def test_an_mpi_job_runs_in_a_restricted_namespace(
    cluster: Cluster, restricted: str, crd: None, operator: OperatorProcess
) -> None:
    jobs = Jobs(cluster, restricted)
    jobs.create(job_manifest("pi", **CPU_MPI))
    status = jobs.wait_phase("pi", "Running")
    assert condition(status, "Running")["reason"] == "LauncherRunning"
    jobs.end_worker(running_launcher(jobs, "pi").metadata.name, 0)
    jobs.wait_phase("pi", "Succeeded")


def test_a_gaudi_job_is_refused_by_the_server_as_render_says(
    cluster: Cluster, restricted: str, crd: None, operator: OperatorProcess, tmp_path: Path
) -> None:
    gaudi = job_manifest("hpu", nodes=1, accelerator={"type": "gaudi", "perNode": 8})
    path = tmp_path / "hpu.yaml"
    path.write_text(yaml.safe_dump(gaudi))
    code, said = render_check(path, "restricted")
    assert code == cli.EXIT_POD_SECURITY
    assert "host namespaces (hostIPC=true)" in said
    jobs = Jobs(cluster, restricted)
    jobs.create(gaudi)

    def refusal() -> str | None:
        """The server's words, in the operator's log or in an Event on the job."""
        events = cluster.core.list_namespaced_event(restricted).items
        said = [*operator.log().splitlines(), *(e.message or "" for e in events)]
        return next((line for line in said if REFUSED in line), None)

    refused = wait_for(refusal, "the server's refusal of the Gaudi worker")
    assert "host namespaces" in refused and "unrestricted capabilities" in refused
    assert not jobs.pods("hpu")
