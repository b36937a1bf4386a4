"""docs/install.md's "Trying it on kind", walked for real with `make test-kind`: a kind cluster
with Podman as its provider on a node image assembled from our builds, both images built from
the Dockerfiles and loaded, the chart installed, the digits example trained to Succeeded, the
cluster deleted; the host put back as it was (hack/devcluster/kind.py).

Not part of `make test`: the CPU trainer image is about 6 GB here (PyPI's torch brings CUDA's
libraries), its load into the node takes minutes and 12 GB of disk."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.kind import support
from tests.kind.lines import as_run_here, kind_lines

if not support.ENABLED:
    pytest.skip(support.SKIP_REASON, allow_module_level=True)


def _diagnostics(env: dict[str, str]) -> str:
    said = []
    for args in (
        ["get", "pods", "--all-namespaces", "-o", "wide"],
        ["get", "events", "--all-namespaces", "--sort-by=.lastTimestamp"],
        ["--namespace", "kube-ddp", "logs", "deployment/kube-ddp", "--tail=40"],
    ):
        done = support.run_step(["kubectl", *args], env)
        said.append(f"$ kubectl {' '.join(args)}\n{done.stdout}{done.stderr}")
    return "\n".join(said)


@pytest.mark.timeout(3600)
def test_the_kind_lines_train_the_digits_example(tmp_path: Path) -> None:
    dev = support.dev_cluster()
    local: dict[str, Any] = {
        "python_bases": dev.images.python_bases(),
        "torch_index": dev.images.TORCH_INDEX,
        "ca_bundle": dev.images.CA_BUNDLE,
        "node_image": dev.kind.node_image(),
        "cgroup_v1_config": dev.kind.cgroup_v1_config(),
        "archive": tmp_path / "images.tar",
    }
    lines = kind_lines()
    cluster = lines[0][lines[0].index("--name") + 1]
    said: list[str] = []
    with support.kind_host(tmp_path / "kubeconfig", cluster) as env:
        for line in lines:
            for command in as_run_here(line, **local):
                done: subprocess.CompletedProcess[str] = support.run_step(command, env)
                output = done.stdout[-2000:] + done.stderr[-2000:]
                said.append(f"$ {' '.join(command)}\n{output}")
                if done.returncode != 0:
                    pytest.fail("\n".join([*said, _diagnostics(env)]))
    get_jobs = next(s for s in said if s.startswith("$ kubectl get ddpjobs"))
    header, row = get_jobs.splitlines()[1:3]
    assert header.split()[:2] == ["NAME", "PHASE"], get_jobs
    assert row.split()[:2] == ["digits", "Succeeded"], "\n".join(said)
