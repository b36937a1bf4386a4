"""Session-wide: the tiers run in the order of what they need (unit, trainer, cluster, e2e),
the host tools the collected tiers need are installed before the first test, the builds the
tiers plan run in the background meanwhile (tests/background_builds.py), and every host command
the session ran is checked against hack/devcluster/packages.py at its end (tests/host_tools.py
says why)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest

from tests.background_builds import (
    BUILDS,
    WAITS_FOR_A_BUILD,
    in_tier_order,
    session_stderr,
    tier_of,
    tier_rank,
    uses_module,
)
from tests.cluster.support import load_dev_cluster
from tests.host_tools import CommandLog, install_for, unlisted

LAST = "last_in_tier"
COMMANDS = CommandLog()
COMMANDS.install()

# A session started in the background of a non-interactive shell inherits SIGINT ignored, and
# so would every `kube-ddp run --local` it starts: the tests' Ctrl-C would reach none of them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(trylast=True)  # after the tiers' conftests said which tests wait for a build
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit, trainer, cluster, e2e: the tiers that need no build run while the others' build;
    a test marked `last_in_tier` after the rest of its tier, which run while it builds, and
    the modules that wait for an add-on after those that wait for none."""
    items[:] = in_tier_order(
        items,
        lambda item: item.path,
        last=lambda item: bool(item.get_closest_marker(LAST)),
        waits=lambda item: item.stash.get(WAITS_FOR_A_BUILD, False),
    )


# The object store of the tests that use it: versitygw, whose fixture reports a failed build.
S3_SERVER = "tests.s3_server"


def pytest_collection_finish(session: pytest.Session) -> None:
    started = time.monotonic()
    problem = install_for(item.path for item in session.items)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if problem and reporter:
        reporter.write_line(problem)
    if reporter:
        reporter.write_line(f"host packages: {time.monotonic() - started:.0f} s")
    s3_users = [item for item in session.items if uses_module(item, S3_SERVER)]
    if s3_users:  # before the cluster's builds, which hold the build lock for long
        BUILDS.plan(
            "versitygw",
            min((tier_of(item.path) for item in s3_users), key=tier_rank),
            lambda: load_dev_cluster().built("versitygw"),
            lambda item: uses_module(item, S3_SERVER),
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """The planned builds started as the tests start (not for --collect-only, nor after
    collection errors), their log lines to the session's stderr."""
    config = session.config
    if (
        not BUILDS.planned
        or config.option.collectonly
        or (session.testsfailed and not config.option.continue_on_collection_errors)
    ):
        return
    log = session_stderr()
    BUILDS.start(lambda: prepare_build_thread(log))


def prepare_build_thread(log: TextIO) -> None:
    """The build thread's log lines to `log`; its nice value (Linux: a thread's own, which the
    processes it starts inherit) the Go builds' own, so that the operator image's build yields
    the CPU to the tests as they do."""
    dev_cluster = load_dev_cluster()
    dev_cluster.paths.log_to(log)
    thread = threading.get_native_id()
    nice = max(dev_cluster.build.BUILD_NICE, os.getpriority(os.PRIO_PROCESS, thread))
    os.setpriority(os.PRIO_PROCESS, thread, nice)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Outside the test's output capture and outside pytest-timeout's timer (its wrapper of
    this hook runs inside this one, tryfirst): a new tier's clock starts, then the builds the
    test needs are waited for, so that no test's timeout counts them."""
    del nextitem
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    TIERS.enter(item.path, reporter)

    def say(line: str) -> None:
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(line)

    BUILDS.wait_for(item, say)
    return (yield)


class TierClock:
    """How long each tier (tests/<tier>/) took, said as the next one starts and at the end, so
    every CI log shows where the time went (builds say their own)."""

    def __init__(self) -> None:
        self.tier: str | None = None
        self.started = 0.0

    def enter(self, path: Path, reporter: Any) -> None:
        tier = tier_of(path)
        if tier != self.tier:
            self.close(reporter)
            self.tier, self.started = tier, time.monotonic()

    def close(self, reporter: Any) -> None:
        if self.tier is not None and reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"tier {self.tier}: {time.monotonic() - self.started:.0f} s")
        self.tier = None


TIERS = TierClock()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    TIERS.close(reporter)
    if BUILDS.running() and exitstatus != pytest.ExitCode.INTERRUPTED:
        # The session ended before the tests that need them: the cache is filled all the same.
        if reporter:
            reporter.write_line("waiting for the background builds to end")
        BUILDS.join()
    names = unlisted(COMMANDS)
    if not names:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line(
            "host commands this session ran that hack/devcluster/packages.py does not list "
            f"(add each to a Need with its Debian package, or to BASE): {', '.join(names)}",
            red=True,
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
