"""What both kind tests share: when they run, the pinned tools they run, a cluster's lifecycle
on the host kind needs (hack/devcluster/kind.py)."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from tests.cluster.support import REPO, load_dev_cluster

ENABLED = os.environ.get("KUBEDDP_KIND") == "1"
SKIP_REASON = "the kind tier runs with `make test-kind` (minutes, about 20 GB of disk)"
STEP_TIMEOUT_S = 1800  # a cold torch CPU base: pip brings about 3 GB


def dev_cluster() -> ModuleType:
    """hack/devcluster, with the kind tier's host packages installed."""
    dev = load_dev_cluster()
    dev.packages.ensure([dev.packages.KIND])
    return dev


@functools.cache
def pinned_tools() -> dict[str, str]:
    """kind, kubectl and helm from the binary cache, by name."""
    built = load_dev_cluster().built
    return {tool: str(built(tool)) for tool in ("kind", "kubectl", "helm")}


@contextmanager
def kind_host(kubeconfig: Path, cluster: str) -> Iterator[dict[str, str]]:
    """The environment to run kind, podman, kubectl and helm in, the host prepared for kind
    and put back after; the cluster `cluster` deleted at the end, whatever happened."""
    kind = load_dev_cluster().kind
    with kind.host_prepared() as kind_env:
        env = dict(kind_env, KUBECONFIG=str(kubeconfig))
        try:
            yield env
        finally:
            subprocess.run(
                [pinned_tools()["kind"], "delete", "cluster", "--name", cluster],
                env=env,
                capture_output=True,
                check=False,
            )


def run_step(
    command: list[str], env: dict[str, str], timeout: float = STEP_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """One command in the repository, the pinned tools for their names."""
    tool = pinned_tools().get(command[0], command[0])
    return subprocess.run(
        [tool, *command[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
