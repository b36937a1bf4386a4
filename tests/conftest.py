"""Session-wide: the host tools the collected tiers need are installed before the first test,
and every host command the session ran is checked against hack/devcluster/packages.py at its
end (tests/host_tools.py says why)."""

from __future__ import annotations

import signal

import pytest

from tests.host_tools import CommandLog, install_for, unlisted

COMMANDS = CommandLog()
COMMANDS.install()

# A session started in the background of a non-interactive shell inherits SIGINT ignored, and
# so would every `kube-ddp run --local` it starts: the tests' Ctrl-C would reach none of them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session: pytest.Session) -> None:
    problem = install_for(item.path for item in session.items)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if problem and reporter:
        reporter.write_line(problem)


def pytest_sessionfinish(session: pytest.Session) -> None:
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
