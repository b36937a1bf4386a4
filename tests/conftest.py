"""Session-wide: the tiers run in the order of what they need (unit, trainer, cluster, e2e),
the host tools the collected tiers need are installed before the first test,
and every host command the session ran is checked against hack/devcluster/packages.py at its
end (tests/host_tools.py says why)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.background_builds import in_tier_order
from tests.cluster.support import REPO
from tests.host_tools import TESTS, CommandLog, install_for, unlisted

COMMANDS = CommandLog()
COMMANDS.install()

# A session started in the background of a non-interactive shell inherits SIGINT ignored, and
# so would every `kube-ddp run --local` it starts: the tests' Ctrl-C would reach none of them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit, trainer, cluster, e2e: the tiers that need no build run first."""
    items[:] = in_tier_order(items, lambda item: item.path)


def pytest_collection_finish(session: pytest.Session) -> None:
    started = time.monotonic()
    problem = install_for(item.path for item in session.items)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if problem and reporter:
        reporter.write_line(problem)
    if reporter:
        reporter.write_line(f"host packages: {time.monotonic() - started:.0f} s")


class TierClock:
    """How long each tier (tests/<tier>/) took, said as the next one starts and at the end, so
    every CI log shows where the time went (builds say their own)."""

    def __init__(self) -> None:
        self.tier: str | None = None
        self.started = 0.0

    def enter(self, path: Path, reporter: Any) -> None:
        tier = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
        if tier != self.tier:
            self.close(reporter)
            self.tier, self.started = tier, time.monotonic()

    def close(self, reporter: Any) -> None:
        if self.tier is not None and reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"tier {self.tier}: {time.monotonic() - self.started:.0f} s")
        self.tier = None


TIERS = TierClock()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Outside the test's output capture, unlike its setup."""
    del nodeid
    TIERS.enter(REPO / location[0], CONFIG[0].pluginmanager.get_plugin("terminalreporter"))


CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    CONFIG.append(config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    TIERS.close(session.config.pluginmanager.get_plugin("terminalreporter"))
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
