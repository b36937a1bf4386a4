"""docs/install.md's "Trying it on kind", walked for real with `make test-kind`: a kind cluster
with Podman as its provider on a node image assembled from our builds, both images built from
the Dockerfiles and loaded, the chart installed, the digits example trained to Succeeded, the
cluster deleted; the host put back as it was (hack/devcluster/kind.py).

Not part of `make test`: the CPU trainer image is about 6 GB here (PyPI's torch brings CUDA's
libraries), its load into the node takes minutes and 12 GB of disk."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.support import REPO, load_dev_cluster
from tests.kind.lines import as_run_here, kind_lines

if os.environ.get("KUBEDDP_KIND") != "1":
    pytest.skip(
        "the kind tier runs with `make test-kind` (minutes, about 20 GB of disk)",
        allow_module_level=True,
    )

STEP_TIMEOUT_S = 1800  # a cold torch CPU base: pip brings about 3 GB


def _diagnostics(kubectl: str, env: dict[str, str]) -> str:
    said = []
    for args in (
        ["get", "pods", "--all-namespaces", "-o", "wide"],
        ["get", "events", "--all-namespaces", "--sort-by=.lastTimestamp"],
        ["--namespace", "kube-ddp", "logs", "deployment/kube-ddp", "--tail=40"],
    ):
        command = [kubectl, *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        said.append(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
    return "\n".join(said)


@pytest.mark.timeout(3600)
def test_the_kind_lines_train_the_digits_example(tmp_path: Path) -> None:
    dev_cluster = load_dev_cluster()
    kind, images, built = dev_cluster.kind, dev_cluster.images, dev_cluster.built
    dev_cluster.packages.ensure([dev_cluster.packages.KIND])
    node_image = kind.node_image()
    local: dict[str, Any] = {
        "python_bases": images.python_bases(),
        "torch_index": images.TORCH_INDEX,
        "ca_bundle": images.CA_BUNDLE,
        "node_image": node_image,
        "cgroup_v1_config": kind.cgroup_v1_config(),
        "archive": tmp_path / "images.tar",
    }
    lines = kind_lines()
    cluster = lines[0][lines[0].index("--name") + 1]
    pinned = {tool: str(built(tool)) for tool in ("kind", "kubectl", "helm")}
    with kind.host_prepared() as kind_env:
        env = dict(kind_env, KUBECONFIG=str(tmp_path / "kubeconfig"))
        said: list[str] = []
        try:
            for line in lines:
                for command in as_run_here(line, **local):
                    done = subprocess.run(
                        [pinned.get(command[0], command[0]), *command[1:]],
                        cwd=REPO,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=STEP_TIMEOUT_S,
                        check=False,
                    )
                    output = done.stdout[-2000:] + done.stderr[-2000:]
                    said.append(f"$ {' '.join(command)}\n{output}")
                    if done.returncode != 0:
                        pytest.fail("\n".join([*said, _diagnostics(pinned["kubectl"], env)]))
        finally:
            subprocess.run(
                [pinned["kind"], "delete", "cluster", "--name", cluster],
                env=env,
                capture_output=True,
                check=False,
            )
    get_jobs = next(s for s in said if s.startswith("$ kubectl get ddpjobs"))
    header, row = get_jobs.splitlines()[1:3]
    assert header.split()[:2] == ["NAME", "PHASE"], get_jobs
    assert row.split()[:2] == ["digits", "Succeeded"], "\n".join(said)
