"""The README's quick start as commands, read from README.md (never copied into a test), so
that the e2e tier installs the operator and runs the first job exactly as a reader would."""

from __future__ import annotations

import re
import shlex

from tests.cluster.support import REPO

README = REPO / "README.md"


def quick_start_commands() -> list[list[str]]:
    """The lines of the quick start's bash block, split as a shell would."""
    text = README.read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None, "README.md's quick start has no ```bash block"
    lines = [line.strip() for line in block.group(1).splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def helm_install() -> list[str]:
    """The quick start's `helm install ...` (the arguments after `helm`)."""
    (helm,) = [command[1:] for command in quick_start_commands() if command[0] == "helm"]
    assert helm[0] == "install", helm
    return helm


def release_namespace() -> str:
    """The namespace the quick start installs the operator into."""
    args = helm_install()
    for flag in ("--namespace", "-n"):
        if flag in args:
            return args[args.index(flag) + 1]
    raise AssertionError(f"the quick start's helm install names no namespace: {args}")
