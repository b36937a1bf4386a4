"""Fixtures of the cluster tier: a real control plane on 127.0.0.1 (hack/dev-cluster.py).

`cluster` (session): starts the control plane once its build (planned here when collection
ends, run in the background: tests/background_builds.py) has ended, or reuses a running one,
and yields a `tests.cluster.support.Cluster`. `namespace` (function):
a fresh namespace whose `default` ServiceAccount exists, deleted after the test.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from kube_ddp import names
from tests.background_builds import BUILDS, WAITS_FOR_A_BUILD
from tests.cluster.helm_support import Helm, helm_binary
from tests.cluster.operator_support import (
    Jobs,
    OperatorProcess,
    namespace_story,
    running_operator,
)
from tests.cluster.support import IN_CI, Cluster, fresh_namespace, load_dev_cluster

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tier's tests marked; those of a module that waits for an add-on said so (they run
    after the others, while a cold cache builds their add-ons)."""
    mine = [item for item in items if item.path.is_relative_to(HERE)]
    waiting = {item.path for item in mine if addons_of(item)}
    for item in mine:
        item.add_marker(pytest.mark.cluster)
        item.stash[WAITS_FOR_A_BUILD] = item.path in waiting


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report gets its namespace's Events and pods (two kubectl calls a
    passing test does not pay for), read before the namespace fixture deletes them."""
    outcome = yield
    report = outcome.get_result()
    arguments = getattr(item, "funcargs", {})
    if report.when == "call" and report.failed and {"cluster", "namespace"} <= arguments.keys():
        story = namespace_story(arguments["cluster"], arguments["namespace"])
        report.sections.append(("namespace events and pods", story))


# Add-on binaries (not part of the control plane) that a test module needs, or that a fixture
# needs wherever it is used; each built after the control plane, before the first test that
# needs it (the benchmark's peers last: its test runs last in the tier).
ADDONS = {
    "test_kueue.py": ("kueue",),
    "test_soak.py": ("kueue",),
    "test_operations_kit.py": ("promtool",),
    "test_bench.py": (
        "mpi-operator",
        "training-operator",
        "jobset",
        "trainer-controller-manager",
    ),
    "test_real_node_host.py": load_dev_cluster().node.NODE_BINARIES,
}
FIXTURE_ADDONS = {
    "helm": ("helm",),
    "offline_helm": ("helm",),
    "mpi_operator": ("mpi-operator",),
    "mpijob_crd": ("mpi-operator",),
}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Plan the cold cache's builds (tests/background_builds.py): the control plane, then the
    add-ons in the order the tier's tests first need them. They take many minutes, which the
    tests that need none of them run beside, and no test's timeout counts."""
    mine = [item for item in session.items if item.path.is_relative_to(HERE)]
    if not mine:
        return
    dev_cluster = load_dev_cluster()
    if missing_tool_reason(dev_cluster) and not IN_CI:
        return
    addons = list(dict.fromkeys(addon for item in mine for addon in addons_of(item)))
    if not dev_cluster.binaries_ready():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line(
                "cluster tests: building the control plane from Go modules into "
                f"{dev_cluster.CACHE_DIR} in the background (cold cache: about 10 min on 2 "
                "cores); the tests that need no cluster run meanwhile"
            )
    BUILDS.plan("cluster", "cluster", dev_cluster.build_all, needs_the_cluster)
    for addon in addons:
        BUILDS.plan(
            f"add-on {addon}",
            "cluster",
            functools.partial(build, addon),
            functools.partial(uses_addon, addon),
        )


def addons_of(item: pytest.Item) -> tuple[str, ...]:
    by_module = ADDONS.get(item.path.name, ())
    fixtures = getattr(item, "fixturenames", ())
    return (*by_module, *(a for f in fixtures for a in FIXTURE_ADDONS.get(f, ())))


def build(addon: str) -> None:
    """An add-on's binary (a no-op when warm)."""
    dev_cluster = load_dev_cluster()
    with contextlib.suppress(dev_cluster.BuildError):  # the fixture that uses it says why
        dev_cluster.built(addon)


def uses_addon(addon: str, item: pytest.Item) -> bool:
    return item.path.is_relative_to(HERE) and addon in addons_of(item)


def needs_the_cluster(item: pytest.Item) -> bool:
    """The tier's tests, the e2e tier's (on the dev cluster) and any test of its fixtures."""
    if item.path.is_relative_to(HERE) or item.get_closest_marker("e2e") is not None:
        return True
    return bool({"cluster", "offline_helm"} & set(getattr(item, "fixturenames", ())))


def missing_tool_reason(dev_cluster: object) -> str | None:
    if not dev_cluster.binaries_ready() and shutil.which("go") is None:  # type: ignore[attr-defined]
        return "no Go toolchain to build the control plane (hack/dev-cluster.py build)"
    if shutil.which("openssl") is None:
        return "no openssl to make the control plane's certificates"
    return None


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    dev_cluster = load_dev_cluster()
    reason = missing_tool_reason(dev_cluster)
    if reason and not IN_CI:
        pytest.skip(reason)  # in CI, the build below fails loudly instead
    error = BUILDS.wait("cluster")
    if error:
        pytest.fail(f"building the control plane failed: {error}", pytrace=False)
    dev_cluster.STATE_DIR.mkdir(exist_ok=True)
    # Several test sessions may share one cluster: each holds this lock shared, and the last
    # one out stops a cluster that a test session started (`make cluster-up`'s stays up).
    with open(dev_cluster.STATE_DIR / "users.lock", "w") as users:
        fcntl.flock(users, fcntl.LOCK_SH)
        try:
            state = dev_cluster.up(owner="pytest")
        except (dev_cluster.BuildError, dev_cluster.ClusterError) as error:
            pytest.fail(f"the local control plane did not come up: {error}", pytrace=False)
        cluster = Cluster.of_dev_cluster(state)
        try:
            yield cluster
        finally:
            cluster.api.close()
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                still = dev_cluster.read_state()
                if (
                    still
                    and still["owner"] == "pytest"
                    and not os.environ.get("KUBEDDP_KEEP_CLUSTER")
                ):
                    dev_cluster.down()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    with fresh_namespace(cluster, f"{slug}-{uuid.uuid4().hex[:6]}") as name:
        yield name


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    """manifests/crd.yaml applied (server-side, so the large CRD fits) and Established: polled,
    as the dev cluster polls its CRDs (`kubectl wait` fails outright on a CRD with no status
    yet, and failed the session's first cluster test so)."""
    path = HERE.parents[1] / "manifests" / "crd.yaml"
    controlplane = load_dev_cluster().controlplane
    controlplane.apply_crds([path], [f"{names.PLURAL}.{names.GROUP}"], cluster.kubeconfig)


@pytest.fixture
def jobs(cluster: Cluster, namespace: str, crd: None) -> Jobs:
    """DDPTrainingJobs and their pods in the test's namespace."""
    return Jobs(cluster, namespace)


@pytest.fixture
def operator(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """`kube-ddp operator` watching the test's namespace (its log is printed on failure)."""
    with running_operator(cluster, namespace, tmp_path) as process:
        yield process


@pytest.fixture(scope="module")
def mpi_operator(cluster: Cluster) -> Iterator[None]:
    """The Kubeflow MPI Operator (hack/devcluster/mpioperator.py) watching every namespace, for
    one test module. Its CRD is removed afterwards unless it was there before, so other modules
    meet the cluster as it was (some check what a cluster without MPIJobs does)."""
    mpioperator = load_dev_cluster().mpioperator
    had_crd = mpioperator.crd_installed(cluster.kubeconfig)
    try:
        with mpioperator.running(cluster.kubeconfig):
            yield
    finally:
        if not had_crd:
            mpioperator.remove_crd(cluster.kubeconfig)


@pytest.fixture
def mpijob_crd() -> ModuleType:
    """hack/devcluster/mpioperator.py, for a test that installs and removes the MPIJob CRD
    itself (the file comes with the MPI Operator's build, an add-on) and runs no operator."""
    return load_dev_cluster().mpioperator


@pytest.fixture(scope="session")
def offline_helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The dev cluster's helm for what needs no cluster (template, lint, package): no kubeconfig."""
    dev_cluster = load_dev_cluster()
    try:
        dev_cluster.built("helm")
    except dev_cluster.BuildError as error:
        pytest.fail(f"helm did not build: {error}", pytrace=False)
    home = tmp_path_factory.mktemp("offline-helm")
    return Helm(helm_binary(), home / "no-kubeconfig", home)


@pytest.fixture(scope="session")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The dev cluster's helm (an add-on build), on the admin kubeconfig; its
    cache, config and data in a temporary directory."""
    return Helm(helm_binary(), cluster.kubeconfig, tmp_path_factory.mktemp("helm-home"))
