"""A straggler seen: two real ranks under torchrun, one of them given a fifth of a core by a
cgroup's CPU quota; rank 0's ledger thread names it in status.training.straggler, and clears
it once the quota is lifted."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from ddp_trainer import contract
from tests.cluster.support import wait_for
from tests.cpu_quota import QUOTA_SHARE, cpu_quota
from tests.trainer import support
from tests.trainer.support import FakeApiServer


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
            wait_for(lambda: bool(api_server.requests), "a first report", 120)
            time.sleep(3)  # some steps at full speed (two ranks on two shared cores: either
            # may be found slower for a while when the machine is busy, as it should be)
            quota.slow(rank_1)
            wait_for(
                lambda: latest(api_server) is not None and latest(api_server)["rank"] == 1,
                "rank 1 named",
                120,
            )
            named = latest(api_server)
            assert named is not None and named["slowerBy"] >= contract.STRAGGLER_RATIO, named
            assert named["message"].startswith("rank 1 (pod "), named
            print(f"rank 1 at {QUOTA_SHARE:.0%} of a core: {named['message']}")
            quota.release(rank_1)
            wait_for(lambda: (latest(api_server) or {}).get("rank") != 1, "rank 1 cleared", 120)
        finally:
            os.killpg(run.pid, 9)
            run.wait()
