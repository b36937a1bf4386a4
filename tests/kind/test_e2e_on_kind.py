"""The e2e tier on kind, as .github/workflows/e2e.yaml runs it, run here with `make test-kind`:
the operator image and the CPU trainer image built (hack/devcluster/images.py), a kind cluster
with Podman on the node image assembled from our builds, both images loaded, then
`pytest tests/e2e` against it with the workflow's KUBEDDP_E2E_* settings. The tier's tests that
need the dev cluster's own host (its kubelet, the MPI Operator, Kueue, the object store) skip,
as they do in the workflow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.kind import support

if not support.ENABLED:
    pytest.skip(support.SKIP_REASON, allow_module_level=True)

CLUSTER = "kube-ddp-e2e"  # the workflow's KIND_CLUSTER
E2E_TIMEOUT_S = 3600


@pytest.mark.timeout(5400)
def test_the_e2e_tier_passes_on_kind(tmp_path: Path) -> None:
    dev = support.dev_cluster()
    import release  # type: ignore[import-not-found]  # hack/release.py, on sys.path with devcluster

    operator = dev.images.OPERATOR_IMAGE
    dev.images.operator_image_archive()  # built into the store under that name
    trainer = dev.images.trainer_cpu_image(release.torch_version())
    archive = tmp_path / "images.tar"
    tools = support.pinned_tools()
    with support.kind_host(tmp_path / "kubeconfig", CLUSTER) as env:
        for step in (
            ["kind", "create", "cluster", "--name", CLUSTER, "--image", dev.kind.node_image(),
             "--config", str(dev.kind.cgroup_v1_config())],
            ["podman", "save", "-m", "-o", str(archive), operator, trainer],
            ["kind", "load", "image-archive", str(archive), "--name", CLUSTER],
        ):  # fmt: skip
            done = support.run_step(step, env)
            assert done.returncode == 0, f"$ {' '.join(step)}\n{done.stdout}{done.stderr}"
        archive.unlink()
        e2e_env = dict(
            env,
            KUBEDDP_E2E_KUBECONFIG=env["KUBECONFIG"],
            KUBEDDP_E2E_OPERATOR_IMAGE=operator,
            KUBEDDP_E2E_TRAINER_IMAGE=trainer,
            KUBEDDP_E2E_NODE_EXEC=f"podman exec {CLUSTER}-control-plane",
            KUBEDDP_E2E_KUBECTL=tools["kubectl"],
            KUBEDDP_E2E_HELM=tools["helm"],
        )
        tier = support.run_step(
            [sys.executable, "-m", "pytest", "tests/e2e", "-p", "no:cacheprovider", "-q"],
            e2e_env,
            timeout=E2E_TIMEOUT_S,
        )
    assert tier.returncode == 0, tier.stdout[-8000:] + tier.stderr[-2000:]
