"""The host commands the test session runs: installed before the first test, required by the
tests that use them, and checked against hack/devcluster/packages.py when the session ends.

A tier's Debian packages are installed at collection time, in one apt-get, as root (a new
machine has none of them). `require` fails a test naming the package (in CI; elsewhere it
skips). `CommandLog` records every program the session itself starts (Python's audit events
for subprocess and exec), and `unlisted` names those that are neither the project's own (the
venv, the binary cache, the clone) nor in the packages tables: a tool added to a test without
its package is caught here on any machine, including one where it happens to be installed.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.cluster.support import IN_CI, REPO, load_dev_cluster

TESTS = REPO / "tests"
# The packages tables' names (hack/devcluster/packages.py) each tier needs.
TIER_NEEDS = {
    "trainer": ("LAUNCHERS",),
    "cluster": ("REAL_NODE",),  # tests/cluster/harness/test_real_node_host.py
    "e2e": ("REAL_NODE", "MPI_PODS"),
    "kind": ("KIND",),
}


def _packages() -> ModuleType:
    packages: ModuleType = load_dev_cluster().packages
    return packages


def tier_needs(paths: Iterable[Path]) -> list[Any]:
    tiers = {path.relative_to(TESTS).parts[0] for path in paths if path.is_relative_to(TESTS)}
    names = sorted({name for tier in tiers for name in TIER_NEEDS.get(tier, ())})
    return [getattr(_packages(), name) for name in names]


def install_for(paths: Iterable[Path]) -> str | None:
    """Install what the tiers of `paths` need (as root); a line to show when something is still
    missing (not root, outside CI), else None. In CI a failed install stops the session."""
    needs = tier_needs(paths)
    try:
        _packages().ensure(needs)
    except load_dev_cluster().ClusterError as error:
        if IN_CI:
            pytest.exit(f"host packages: {error}", returncode=1)
        return f"host packages not installed ({error}): the tests that need them skip"
    return None


def require(need_name: str) -> None:
    """Fail (in CI) or skip this test when a tool of the packages table `need_name` is missing,
    naming its package."""
    dev_cluster = load_dev_cluster()
    try:
        dev_cluster.packages.require(getattr(dev_cluster.packages, need_name))
    except dev_cluster.ClusterError as error:
        if IN_CI:
            pytest.fail(str(error), pytrace=False)
        pytest.skip(str(error))


SHELLS = frozenset({"sh", "bash"})
# Reserved words stand before a command's name; builtins run no program.
SHELL_KEYWORDS = frozenset(
    {"!", "if", "then", "elif", "else", "fi", "while", "until", "do", "done", "esac", "{", "}"}
)
SHELL_BUILTINS = frozenset(
    {"cd", "echo", "exec", "export", "printf", "set", "shift", "test", "[", "read", "break"}
    | {"continue", "return", "exit", "wait", "trap", "local", "true", "false", ":", "command"}
)
REDIRECTION = re.compile(r"\d*(<<?|>>?|<>|>&|<&)")
# `$(` starts a command; `$((` arithmetic, which the word with its `=` then drops.
COMMAND_SEPARATORS = re.compile(r"&&|\|\||;|\||\n|\$\((?!\()|`")


def script_commands(script: str) -> set[str]:
    """The programs a `sh -c` script names: the first word of each simple command, past
    reserved words, that is no builtin, variable or assignment (enough for the short scripts
    the tests and hack run)."""
    commands = set()
    # In single quotes `$(` and backquotes are literal text (a value the script quotes), but
    # a nested `sh -c '...'` still names its commands: only the substitutions are dropped.
    script = _literal_substitutions_dropped(script)
    for part in COMMAND_SEPARATORS.split(script):
        words = [w.strip("()") for w in part.split() if "=" not in w.split("/")[0]]
        words = [w for w in words if w]
        while words and (words[0] in SHELL_KEYWORDS or REDIRECTION.match(words[0])):
            # A lone redirection (`< file`, `2> log`) takes the next word as its file.
            alone = REDIRECTION.fullmatch(words.pop(0))
            if alone and words:
                words.pop(0)
        if words and words[0] in ("for", "case"):  # a list of words, not a command
            continue
        first = words[0] if words else ""
        if first and first not in SHELL_BUILTINS and first[0] not in "\"'$\\>&":
            commands.add(first)
    return commands


def _literal_substitutions_dropped(script: str) -> str:
    """`script` with each `$(` and backquote inside single quotes (outside double quotes, past
    backslashes) made plain text: there sh takes them literally."""
    out, quote, escaped = [], "", False
    for at, char in enumerate(script):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        elif quote == "'" and (char == "`" or (char == "$" and script[at + 1 : at + 2] == "(")):
            out.append(" ")
            continue
        out.append(char)
    return "".join(out)


class CommandLog:
    """Every program this process starts, as it was named (a bare name or a path), and those
    the `sh -c` scripts it starts name."""

    EVENTS = ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn")

    def __init__(self) -> None:
        self.commands: set[str] = set()
        self.path = os.environ.get("PATH", "")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in self.EVENTS:
            return
        executable, argv = args[0], args[1]
        name = executable if executable is not None else (argv[0] if argv else None)
        if isinstance(name, bytes | os.PathLike):
            name = os.fsdecode(name)
        if not isinstance(name, str) or not name:
            return
        self.commands.add(name)
        words = [os.fsdecode(w) if isinstance(w, bytes | os.PathLike) else str(w) for w in argv]
        for shell_at, word in enumerate(words):
            if Path(word).name in SHELLS and words[shell_at + 1 : shell_at + 2] == ["-c"]:
                if len(words) > shell_at + 2:
                    self.commands |= script_commands(words[shell_at + 2])
                break

    def install(self) -> None:
        sys.addaudithook(self)


def _own(path: Path) -> bool:
    """The project's own programs: the clone's, the venv's and the binary cache's."""
    absolute = Path(os.path.abspath(path))  # symlinks kept: the venv's python links out
    roots = (REPO, Path(sys.prefix), load_dev_cluster().CACHE_DIR)
    return any(absolute.is_relative_to(os.path.abspath(root)) for root in roots)


def host_commands(commands: Iterable[str], search_path: str) -> set[str]:
    """The host's programs among `commands`: a bare name found outside the project's own
    directories, or not found at all; a path outside them."""
    found = set()
    for command in commands:
        located = shutil.which(command, path=search_path) if "/" not in command else command
        if located is None or not _own(Path(located)):
            found.add(command)
    return found


def unlisted(log: CommandLog) -> list[str]:
    unlisted_commands: list[str] = _packages().unlisted(host_commands(log.commands, log.path))
    return unlisted_commands
