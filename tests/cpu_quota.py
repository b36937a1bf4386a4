"""A cgroup that gives its processes a fifth of a core: a rank slowed for real, as a
throttled GPU or a noisy neighbour slows one (the straggler tests). Needs root and a cgroup
cpu controller (v1 or v2); everything moved in is moved back and the cgroup removed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller, as on this machine
UNIFIED_CGROUPS = Path("/sys/fs/cgroup")  # cgroup v2
QUOTA_SHARE = 0.2


def _cgroup_root() -> tuple[Path, str] | None:
    """Where to make a cgroup with a CPU quota, and its version, if this process may."""
    if os.geteuid() != 0:
        return None
    if (CPU_CGROUPS / "cpu.cfs_quota_us").exists():
        return CPU_CGROUPS, "v1"
    controllers = UNIFIED_CGROUPS / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return UNIFIED_CGROUPS, "v2"
    return None


def _own_cgroup(pid: int, version: str) -> Path:
    """The cgroup `pid` is in now, to put it back there."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == "v1" and "cpu" in controllers.split(",")) or (
            version == "v2" and controllers == ""
        ):
            root = CPU_CGROUPS if version == "v1" else UNIFIED_CGROUPS
            return root / path.lstrip("/")
    raise AssertionError(f"no {version} cpu cgroup for {pid}")


class Quota:
    """A cgroup that gives its processes QUOTA_SHARE of a core."""

    def __init__(self, root: Path, version: str, name: str) -> None:
        self.root, self.version, self.group = root, version, root / name
        self.homes: dict[int, Path] = {}  # where each process moved in was

    def make(self) -> None:
        self.group.mkdir()
        period = 100_000
        if self.version == "v1":
            (self.group / "cpu.cfs_period_us").write_text(str(period))
            (self.group / "cpu.cfs_quota_us").write_text(str(int(period * QUOTA_SHARE)))
        else:
            (self.group / "cpu.max").write_text(f"{int(period * QUOTA_SHARE)} {period}")

    def slow(self, pid: int) -> None:
        """Move `pid`, every thread of it, into the cgroup."""
        self.homes[pid] = _own_cgroup(pid, self.version)
        (self.group / "cgroup.procs").write_text(str(pid))

    def release(self, pid: int) -> None:
        """Move `pid` back where it was."""
        with contextlib.suppress(OSError):  # it may have ended
            (self.homes.pop(pid) / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for pid in list(self.homes):
            self.release(pid)
        for pid in (self.group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (self.root / "cgroup.procs").write_text(pid)
        self.group.rmdir()


@contextlib.contextmanager
def cpu_quota(name: str) -> Iterator[Quota]:
    """A `Quota` cgroup for the block; every process moved back and the cgroup removed after."""
    found = _cgroup_root()
    if found is None:
        pytest.skip("a CPU quota needs root and a cgroup cpu controller")
    quota = Quota(*found, name)
    quota.make()
    try:
        yield quota
    finally:
        quota.remove()
