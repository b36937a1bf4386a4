"""The host-tool tables and the end-of-session check (tests/host_tools.py): a command the
session runs is either the project's own, listed with its Debian package, or on every new
machine; anything else is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.support import REPO, load_dev_cluster
from tests.host_tools import CommandLog, host_commands, script_commands, tier_needs, unlisted

packages = load_dev_cluster().packages


def test_a_command_no_table_lists_is_named(tmp_path: Path) -> None:
    tool = tmp_path / "frobnicate"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    log = CommandLog()
    log.path = f"{tmp_path}:/usr/bin:/bin"
    log("subprocess.Popen", (None, ["frobnicate", "--now"], None, None))
    log("subprocess.Popen", (None, ["iptables-save"], None, None))  # listed, found or not
    log("subprocess.Popen", ("/usr/sbin/sshd", ["sshd", "-D"], None, None))  # listed by name
    log("os.exec", (b"/bin/sh", [b"sh", b"-c", b"true"], None))  # on every machine
    assert unlisted(log) == ["frobnicate"]


def test_the_projects_own_programs_are_not_host_commands() -> None:
    own = {sys.executable, str(REPO / "hack" / "dev-cluster.py"), "kube-ddp"}
    search_path = str(Path(sys.executable).parent)  # the venv's bin: kube-ddp is there
    assert host_commands(own, search_path) == set()
    assert host_commands({"no-such-tool-anywhere"}, search_path) == {"no-such-tool-anywhere"}


def test_the_log_records_what_this_process_starts() -> None:
    log = CommandLog()
    log.install()  # an audit hook stays for the process: the log is only a set
    subprocess.run(["true"], check=True)
    assert "true" in log.commands


def test_each_tier_needs_its_tables() -> None:
    assert tier_needs([REPO / "tests/unit/test_api.py"]) == []
    assert tier_needs([REPO / "tests/trainer/test_launchers.py"]) == [packages.LAUNCHERS]
    assert tier_needs([REPO / "tests/e2e/test_mpi.py", REPO / "tests/cluster/test_crd.py"]) == [
        packages.MPI_PODS,
        packages.REAL_NODE,
    ]


def test_a_missing_tool_is_named_with_its_package() -> None:
    need = packages.Need("a test", {"no-such-tool-anywhere": "kube-ddp-test-package", "sh": "dash"})
    with pytest.raises(load_dev_cluster().ClusterError) as raised:
        packages.require(need)
    assert str(raised.value) == (
        "a test needs no-such-tool-anywhere, missing here (Debian's kube-ddp-test-package): "
        "`hack/dev-cluster.py packages` (as root) installs every package the test tiers use"
    )
    packages.require(packages.Need("a test", {"sh": "dash"}))  # present: no error


def test_every_listed_tool_is_in_a_package_a_path_or_a_name() -> None:
    for tool, package in packages.INSTALLED.items():
        assert package and (tool.startswith("/") or "/" not in tool), tool
    assert not packages.INSTALLED.keys() & packages.BASE


def test_the_programs_a_shell_script_names_are_recorded_too() -> None:
    script = 'crt=$(cat "$0"/tls.crt) && mount -t tmpfs tmpfs /tmp && exec "$@"'
    assert script_commands(script) == {"cat", "mount"}
    loop = "while true; do sinfo -h && break; sleep 1; done; case x in y) esac"
    assert script_commands(loop) == {"sinfo", "sleep"}
    redirected = "< /etc/hostname read name && 2>/dev/null ls /x && > out tee y; cat <<EOF"
    assert script_commands(redirected) == {"ls", "tee", "cat"}
    counted = "if command -v getent; then until getent x; do n=$((n+1)); x=$(id -u); done; fi"
    assert script_commands(counted) == {"getent", "id"}
    # quoted, `$(` and backquotes are a value's text, not commands
    quoted = "echo \"the job's\" && mpirun -x 'RUN=$(EVIL)' 'a`b`' \"$@\" && hostname; x=$(id -u)"
    assert script_commands(quoted) == {"mpirun", "hostname", "id"}
    log = CommandLog()
    log("subprocess.Popen", (None, ["unshare", "--mount", "sh", "-c", script, "kueue"], None, None))
    assert log.commands == {"unshare", "cat", "mount"}
