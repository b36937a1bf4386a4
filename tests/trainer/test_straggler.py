"""A straggler seen: two real ranks under torchrun, one of them given a fifth of a core by a
cgroup's CPU quota; rank 0's ledger thread names it in status.training.straggler, and clears
it once the quota is lifted."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_trainer import contract
from tests.trainer import support
from tests.trainer.support import FakeApiServer

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


def rank_pid(parent: int, rank: int, timeout: float = 60) -> int:
    """The pid of torchrun's worker of `rank` (a child of `parent`, RANK in its environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{parent}/task/{parent}/children")
        for pid in children.read_text().split() if children.exists() else []:
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if f"RANK={rank}".encode() in environ:
                    return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} under torchrun {parent}")


def stragglers(api_server: FakeApiServer) -> list[dict[str, Any] | None]:
    """Every status.training.straggler rank 0 sent, in order (None: cleared)."""
    said = []
    for request in list(api_server.requests):
        training = request["body"]["status"].get("training", {})
        if "straggler" in training:
            said.append(training["straggler"])
    return said


def latest(api_server: FakeApiServer) -> dict[str, Any] | None:
    """The straggler rank 0 says now (None: none)."""
    said = stragglers(api_server)
    return said[-1] if said else None


def wait_for(what: str, ready: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_rank_given_a_fifth_of_a_core_is_named_and_cleared_when_it_recovers(
    api_server: FakeApiServer, token_file: Path, tmp_path: Path
) -> None:
    env = support.clean_env(
        KUBEDDP_JOB_NAME="slow",
        KUBEDDP_JOB_NAMESPACE="team-a",
        KUBEDDP_API_SERVER=api_server.url,
        KUBEDDP_TOKEN_FILE=str(token_file),
        **{contract.HEARTBEAT_ENV: "1"},
    )
    args = ["--dataset=digits", "--model=wide-resnet", "--wrn-depth=10", "--wrn-width=1"]
    args += ["--batch-size=32", "--epochs=200", "--device=cpu", "--timeout-seconds=120"]
    command = support.torchrun_command(*args)
    with (
        cpu_quota(f"kubeddp-straggler-{os.getpid()}") as quota,
        subprocess.Popen(
            command,
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as run,
    ):
        try:
            rank_1 = rank_pid(run.pid, 1)
            wait_for("a first report", lambda: bool(api_server.requests))
            time.sleep(3)  # some steps at full speed (two ranks on two shared cores: either
            # may be found slower for a while when the machine is busy, as it should be)
            quota.slow(rank_1)
            wait_for(
                "rank 1 named",
                lambda: latest(api_server) is not None and latest(api_server)["rank"] == 1,
            )
            named = latest(api_server)
            assert named is not None and named["slowerBy"] >= contract.STRAGGLER_RATIO, named
            assert named["message"].startswith("rank 1 (pod "), named
            print(f"rank 1 at {QUOTA_SHARE:.0%} of a core: {named['message']}")
            quota.release(rank_1)
            wait_for("rank 1 cleared", lambda: (latest(api_server) or {}).get("rank") != 1)
        finally:
            os.killpg(run.pid, 9)
            run.wait()
