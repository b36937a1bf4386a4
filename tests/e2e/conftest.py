"""Fixtures of the e2e tier: real pods on a real node, the operator installed by its chart.

`platform` (session): the dev cluster with its real node (hack/devcluster; needs root), or the
cluster of KUBEDDP_E2E_KUBECONFIG (tests/e2e/platform.py). `operator` (session): the chart
installed into `kube-ddp-system` and its Deployment Available (its readiness means: leader and
watching). `jobs` (function): DDPTrainingJobs in a fresh namespace, their specs completed by
the platform so their pods land on the real node.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.background_builds import BUILDS
from tests.cluster.conftest import IN_CI, cluster, crd, mpi_operator
from tests.cluster.helm_support import CHART, Helm, helm_binary
from tests.cluster.operator_support import Jobs
from tests.cluster.support import REPO, Cluster, fresh_namespace, load_dev_cluster, wait_for
from tests.e2e import quickstart
from tests.e2e.platform import DevPlatform, Platform, dev_platform, external_platform

HERE = Path(__file__).resolve().parent
# The chart is installed with the README's own quick-start command (tests/e2e/quickstart.py).
RELEASE, CHART_PATH = quickstart.helm_install()[1:3]
OPERATOR_NAMESPACE = quickstart.release_namespace()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)


# Set: the tier runs on that cluster (tests/e2e/platform.py's ExternalPlatform), e.g. kind.
EXTERNAL_KUBECONFIG = "KUBEDDP_E2E_KUBECONFIG"
# Add-on builds every test of the tier needs: the real node's, the chart's helm, the MPI
# Operator's (its MPIJob CRD is served before the operator starts); and those a test module
# needs. Built with the tier's operator image.
TIER_ADDONS = (*load_dev_cluster().node.NODE_BINARIES, "helm", "mpi-operator")
ADDONS = {"test_network_policy.py": "kube-router", "test_mpi.py": "kueue"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Plan what the dev platform builds for the tier (tests/background_builds.py), after the
    cluster tier's builds: the cluster (when that tier is not collected), the add-ons its
    modules need and the operator's image. A build that fails there is built again by the
    fixture that uses it, which fails with the error."""
    mine = [item for item in session.items if item.path.is_relative_to(HERE)]
    if not mine or os.environ.get(EXTERNAL_KUBECONFIG) or (os.geteuid() != 0 and not IN_CI):
        return
    modules = sorted({ADDONS[item.path.name] for item in mine if item.path.name in ADDONS})
    addons = [*TIER_ADDONS, *modules]
    BUILDS.plan("e2e", "e2e", lambda: build(addons), lambda item: item.path.is_relative_to(HERE))


def build(addons: list[str]) -> None:
    dev_cluster = load_dev_cluster()
    with contextlib.suppress(dev_cluster.BuildError):
        dev_cluster.build_all()  # a no-op when warm, or built by the cluster tier's plan
    for addon in addons:
        with contextlib.suppress(dev_cluster.BuildError):
            dev_cluster.built(addon)
    dev_cluster.images.operator_image_archive()  # cached by its sources' digest


def external_cluster() -> Cluster | None:
    kubeconfig = os.environ.get(EXTERNAL_KUBECONFIG)
    if not kubeconfig:
        return None
    api = kubernetes.config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    kubectl = Path(os.environ.get("KUBEDDP_E2E_KUBECTL", "/usr/local/bin/kubectl"))
    return Cluster(
        kubeconfig=Path(kubeconfig),
        server=api.configuration.host,
        ca_file=Path(api.configuration.ssl_ca_cert or ""),
        bin_dir=kubectl.parent,
        api=api,
    )


@pytest.fixture(scope="session")
def platform(request: pytest.FixtureRequest) -> Iterator[Platform]:
    external = external_cluster()
    if external is not None:
        helm = Path(os.environ.get("KUBEDDP_E2E_HELM", "helm"))
        yield external_platform(external, helm)
        return
    if os.geteuid() != 0 and not IN_CI:
        pytest.skip("the real node needs root (containerd, the kubelet, an iptables rule)")
    dev_cluster: Cluster = request.getfixturevalue("cluster")
    request.getfixturevalue("crd")
    node = load_dev_cluster().node
    try:
        node.up()
    except load_dev_cluster().ClusterError as error:
        pytest.fail(f"the real node did not come up: {error}", pytrace=False)
    # The node goes with the cluster: `cluster` stops both when it started them, and a cluster
    # of `make cluster-up` has its real node anyway.
    yield dev_platform(dev_cluster, helm_binary())


@pytest.fixture(scope="session")
def operator(
    platform: Platform, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The chart installed and its Deployment Available; yields the helm client and the
    Deployment."""
    mpioperator = load_dev_cluster().mpioperator
    install_mpijobs = isinstance(platform, DevPlatform) and not mpioperator.crd_installed(
        platform.cluster.kubeconfig
    )
    if install_mpijobs:
        # kube-ddp looks up the kinds it watches when it starts: the MPIJob kind must be served
        # before it, for the MPI tests (the MPI Operator itself runs beside the cluster).
        mpioperator.install_crd(platform.cluster.kubeconfig)
    home = tmp_path_factory.mktemp("helm-home")
    helm = Helm(platform.helm, platform.cluster.kubeconfig, home)
    # The README's `helm install ...`, as `upgrade --install` (a cluster of `make cluster-up`
    # may hold the release of an earlier session), with the images the platform runs.
    readme = quickstart.helm_install()
    assert (REPO / CHART_PATH).resolve() == CHART.resolve(), readme
    args = [str(CHART) if arg == CHART_PATH else arg for arg in readme[1:]]
    helm.run("upgrade", "--install", *args, "--timeout=180s", *platform.helm_args)
    apps = kubernetes.client.AppsV1Api(platform.cluster.api)

    def available() -> Any:
        deployment = apps.read_namespaced_deployment(RELEASE, OPERATOR_NAMESPACE)
        return deployment if (deployment.status.available_replicas or 0) >= 1 else None

    deployment = wait_for(available, "the operator Deployment to be Available", timeout=120)
    yield {"helm": helm, "deployment": deployment}
    helm.run("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", check=False)
    if install_mpijobs:
        mpioperator.remove_crd(platform.cluster.kubeconfig)


@pytest.fixture
def namespace_e2e(platform: Platform, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:30].strip("-")
    with fresh_namespace(platform.cluster, f"e2e-{slug}-{uuid.uuid4().hex[:5]}") as name:
        yield name
    if isinstance(platform, DevPlatform):
        shutil.rmtree(platform.scratch_root / name, ignore_errors=True)  # checkpoints of its jobs


@pytest.fixture
def jobs(platform: Platform, operator: dict[str, Any], namespace_e2e: str) -> Jobs:
    return Jobs(platform.cluster, namespace_e2e)


__all__ = ["cluster", "crd", "mpi_operator"]
