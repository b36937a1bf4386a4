"""Debian packages the dev cluster and the test tiers need, installed with apt-get (as root)
only when a tool they bring is missing: nothing is installed twice, and a machine that has them
needs no root."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

from devcluster.paths import ClusterError, log
from devcluster.processes import run


def missing(tools: Iterable[str]) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None]


def install(packages: Iterable[str], why: str) -> None:
    """apt-get install `packages` (no recommends), or a ClusterError saying what to run."""
    wanted = list(packages)
    if os.geteuid() != 0:
        raise ClusterError(
            f"{why} needs the Debian packages {' '.join(wanted)}: run as root, or "
            f"`apt-get install --no-install-recommends {' '.join(wanted)}` first"
        )
    log(f"installing {', '.join(wanted)} from Debian ({why})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run("apt-get", "update", "-qq", env=env)
    run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *wanted, env=env)
