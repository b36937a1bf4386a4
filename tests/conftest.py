"""Session-wide: the host tools the collected tiers need are installed before the first test,
and every host command the session ran is checked against hack/devcluster/packages.py at its
end (tests/host_tools.py says why)."""

from __future__ import annotations

import pytest

from tests.host_tools import CommandLog, install_for, unlisted

COMMANDS = CommandLog()
COMMANDS.install()


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
