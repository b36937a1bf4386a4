"""The tiers run in the order of what they need, and the builds of the cluster and e2e tiers run
in the background (tests/background_builds.py): a fixture gets a build's result or its error, a
test's timeout does not count the wait, and the builds' log lines reach the session's output.
Fake builds: no Go, no cluster."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.background_builds import Builds, in_tier_order
from tests.cluster.support import REPO

TESTS = REPO / "tests"


def test_tiers_run_unit_trainer_cluster_e2e_each_in_its_own_order() -> None:
    collected = [
        "cluster/test_b.py",
        "e2e/test_a.py",
        "kind/test_a.py",
        "cluster/test_a.py",
        "trainer/test_b.py",
        "helpers_test.py",
        "unit/test_b.py",
        "trainer/test_a.py",
        "unit/test_a.py",
    ]
    ordered = in_tier_order(collected, lambda name: TESTS / name)
    assert ordered == [
        "unit/test_b.py",
        "unit/test_a.py",
        "trainer/test_b.py",
        "trainer/test_a.py",
        "cluster/test_b.py",
        "cluster/test_a.py",
        "e2e/test_a.py",
        "kind/test_a.py",  # outside the four tiers: after them, in their own order
        "helpers_test.py",
    ]
    last = in_tier_order(collected, lambda name: TESTS / name, last=lambda name: "_b" in name)
    assert last[:4] == [
        "unit/test_a.py",
        "unit/test_b.py",
        "trainer/test_a.py",
        "trainer/test_b.py",
    ]
    cluster = ["cluster/test_last.py", "cluster/test_waits.py", "cluster/test_a.py"]
    waiting = in_tier_order(
        cluster,
        lambda name: TESTS / name,
        last=lambda name: "last" in name,
        waits=lambda name: name != "cluster/test_a.py",
    )
    # a module that waits for a build after the others; the last of the tier still last
    assert waiting == ["cluster/test_a.py", "cluster/test_waits.py", "cluster/test_last.py"]


def test_a_waiting_fixture_gets_the_builds_result_or_its_error_in_tier_order() -> None:
    builds, ran = Builds(), []
    gate = threading.Event()

    def cluster() -> None:
        gate.wait(10)
        ran.append("cluster")

    def e2e() -> None:
        ran.append("e2e")
        raise RuntimeError("go build failed: no space left on device")

    builds.plan("e2e", "e2e", e2e, lambda item: True)
    builds.plan("cluster", "cluster", cluster, lambda item: True)
    builds.start()
    assert builds.running()
    waited: list[str | None] = []
    waiter = threading.Thread(target=lambda: waited.append(builds.wait("cluster")))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not waited  # the fixture waits while the build runs
    gate.set()
    waiter.join(10)
    assert waited == [None]
    assert builds.wait("e2e") == "go build failed: no space left on device"
    assert ran == ["cluster", "e2e"]
    assert builds.wait("never planned") is None
    builds.join()
    assert not builds.running()


INNER_CONFTEST = """
import os
import threading
import time

import pytest

from tests.background_builds import BUILDS
from tests.cluster.support import load_dev_cluster
from tests.conftest import pytest_runtest_protocol, pytest_runtestloop


SESSION_NICE = os.getpriority(os.PRIO_PROCESS, 0)


def fake_build():
    time.sleep(0.3)
    load_dev_cluster().paths.log("built fake v1 in 0 s")  # while test_first runs, captured
    nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    load_dev_cluster().paths.log(f"nice {max(nice, 10) == nice}")
    time.sleep(1.5)


def broken_build():
    raise load_dev_cluster().BuildError("go build failed in fake: exit status 2")


def pytest_collection_finish(session):
    BUILDS.plan("fake", "cluster", fake_build, lambda item: "built" in item.name)
    BUILDS.plan("broken", "e2e", broken_build, lambda item: "broken" in item.name)


@pytest.fixture
def broken():
    error = BUILDS.wait("broken")
    if error:
        pytest.fail(f"building failed: {error}", pytrace=False)
"""

INNER_TESTS = """
import os
import time

import conftest


def test_first():
    time.sleep(0.6)
    assert os.getpriority(os.PRIO_PROCESS, 0) == conftest.SESSION_NICE  # the tests' own


def test_needs_what_is_built():
    pass


def test_broken(broken):
    pass
"""


@pytest.mark.parametrize("capture", ["-s", "--capture=fd"])
def test_a_session_waits_outside_the_timeout_and_shows_the_builds_lines(
    tmp_path: Path, capture: str
) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(INNER_CONFTEST))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS))
    session = subprocess.run(
        [sys.executable, "-m", "pytest", capture, "-p", "no:cacheprovider", "-v", str(tmp_path)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = session.stdout + session.stderr
    assert "test_inner.py::test_needs_what_is_built PASSED" in said, said  # waited 1.2 s > 1 s
    assert "ERROR test_inner.py::test_broken - Failed: building failed: go build failed" in said
    assert "waiting for the background builds: fake" in said
    # Written while test_first's output was captured: its captured output is not shown.
    assert "dev-cluster: built fake v1 in 0 s" in said
    assert "dev-cluster: nice True" in said  # the build's thread yields the CPU, not the tests
    assert "Timeout" not in said
