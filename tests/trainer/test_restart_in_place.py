"""Restarts in place, for real: `python -m ddp_trainer.torchrun` agents (one per "pod", told
apart by KUBEDDP_POD_NAME) with c10d rendezvous on 127.0.0.1, their ranks real gloo processes,
their status patches caught by a local HTTP server standing in for the API server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_trainer import agent
from ddp_trainer.contract import EXIT_PEER_LOST, EXIT_PREEMPTED, RANK_RESTART_FIELD
from kube_ddp.local.plan import free_port
from tests.trainer import support
from tests.trainer.support import FakeApiServer

DIGITS = ["--dataset=digits", "--batch-size=32", "--timeout-seconds=60", "--lr=0.05"]
# Each rank writes its rank to argv[1] when it starts; the first time (no argv[3] yet) rank 1
# ends as argv[2] says ("86": every rank exits 86, as when a peer pod was stopped and the
# group saved), the second time every rank finishes. A rank whose peer is gone exits 88, as
# the trainer does.
SCRIPT = """\
import os, sys, pathlib
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
with open(sys.argv[1], "a") as starts:
    starts.write(f"{rank}\\n")
how, marker = sys.argv[2], pathlib.Path(sys.argv[3])
first = not marker.exists()
dist.barrier()
if first:
    if rank == 0:
        marker.touch()
    if how == "86" or rank == 1:
        os._exit(int(how))
    try:
        dist.barrier()
    except Exception:
        os._exit(88)
dist.barrier()
"""


def run_script(
    tmp_path: Path, how: str, env: dict[str, str], max_restarts: int = 3
) -> tuple[support.Run, list[str]]:
    """One agent, two ranks, SCRIPT ending rank 1 (or all) as `how` says; its run and the
    ranks' starts."""
    script, starts = tmp_path / "rank.py", tmp_path / "starts"
    script.write_text(SCRIPT)
    command = support.agent_command(
        str(script),
        str(starts),
        how,
        str(tmp_path / "ended-once"),
        port=free_port(),
        nnodes="1",
        host=True,
        nproc=2,
        max_restarts=max_restarts,
    )
    run = support.run(command, env)
    return run, sorted(starts.read_text().split())


def test_a_rank_exiting_1_under_exit_code_is_not_restarted(
    tmp_path: Path, api_server: FakeApiServer, token_file: Path
) -> None:
    env = support.agent_env("mnist-worker-0", api_server, token_file)
    run, starts = run_script(tmp_path, "1", env)
    assert run.returncode == 1, run.stderr[-3000:]
    assert starts == ["0", "1"]  # started once: no restart
    assert run.stderr.rstrip().endswith("rank 1 exited with code 1 first: exiting 1")
    assert support.patches_of(api_server, RANK_RESTART_FIELD) == []


def test_a_retryable_code_restarts_in_place_and_is_reported_once(
    tmp_path: Path, api_server: FakeApiServer, token_file: Path
) -> None:
    env = support.agent_env("mnist-worker-0", api_server, token_file, KUBEDDP_ATTEMPT="2")
    env["KUBEDDP_RETRYABLE_EXIT_CODES"] = "3,42"
    run, starts = run_script(tmp_path, "42", env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert starts == ["0", "0", "1", "1"]
    assert "rank 1 ended with 42: restarting in place" in run.stderr
    [restart] = support.patches_of(api_server, RANK_RESTART_FIELD)
    assert restart | {"time": "t"} == {
        "attempt": 2,
        "count": 1,
        "time": "t",
        "pod": "mnist-worker-0",
        "node": "node-a",
        "rank": 1,
        "exitCode": 42,
        "message": "rank 1 in pod mnist-worker-0 exited with code 42: its group restarted in place",
    }


def test_ranks_stopped_for_a_peers_sigterm_restart_unreported_and_uncounted(
    tmp_path: Path, api_server: FakeApiServer, token_file: Path
) -> None:
    """Every rank exits 86 (a peer pod was SIGTERMed, the group saved and stopped) while this
    agent was not signalled: its ranks start again, even with no restarts left, and the
    operator hears nothing of it (it sees the stopped pod itself)."""
    env = support.agent_env("mnist-worker-1", api_server, token_file)
    run, starts = run_script(tmp_path, str(EXIT_PREEMPTED), env, max_restarts=0)
    assert run.returncode == 0, run.stderr[-3000:]
    assert starts == ["0", "0", "1", "1"]
    assert f"every failed rank exited {EXIT_PREEMPTED}" in run.stderr
    assert support.patches_of(api_server, RANK_RESTART_FIELD) == []


def test_a_rendezvous_that_times_out_exits_88(tmp_path: Path) -> None:
    """A peer that never comes (its pod cannot be scheduled): the agent exits 88, retryable,
    not torchrun's 1."""
    script = tmp_path / "rank.py"
    script.write_text("")
    command = support.agent_command(str(script), port=free_port(), nnodes="2", host=True)
    command.insert(
        command.index("--rdzv-conf=is_host=true"), "--rdzv-conf=is_host=true,join_timeout=2"
    )
    command.remove("--rdzv-conf=is_host=true")
    run = support.run(command)
    assert run.returncode == EXIT_PEER_LOST, run.stderr[-3000:]
    assert run.stderr.rstrip().endswith(f"exiting {EXIT_PEER_LOST}")


@pytest.mark.parametrize(
    ("nnodes", "poll_s"), [("2", 0.1), ("2:3", 0.1), ("10", 0.1), ("50", 0.5), ("1000", 1.0)]
)
def test_an_agent_looks_at_a_forming_round_more_often_the_smaller_its_group(
    nnodes: str, poll_s: float
) -> None:
    assert agent.rendezvous_poll_s(nnodes) == poll_s


# torch's own c10d rendezvous handler, built as torchrun builds it, after the agent's poll is
# set: how long it serves a state it read, and the sleeps its wait between two looks asks for
# (time.sleep recorded, not slept).
POLL_PROBE = """\
import sys, time
from ddp_trainer import elastic
from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

with elastic.rendezvous_polling(float(sys.argv[2])):
    handler = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{sys.argv[1]}", run_id="probe", min_nodes=1,
        max_nodes=2, is_host=True))
    slept = []
    time.sleep = slept.append
    dynamic_rendezvous._delay(seconds=1)
    dynamic_rendezvous._delay(seconds=(0.5, 0.5))
print(not elastic.missing(), handler._state_holder._cache_duration, slept)
"""


def test_torchs_rendezvous_polls_as_often_as_the_agent_says() -> None:
    """The wait between two looks at a forming round, and how long a state read is served,
    are the agent's 0.1 s, not torch's second; other waits (a random back-off) are torch's."""
    command = [sys.executable, "-c", POLL_PROBE, str(free_port()), "0.1"]
    run = support.run(command)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split(maxsplit=2) == ["True", "0.1", "[0.1, 0.5]\n"]


# --- whole trainer runs, one agent per pod ------------------------------------------------------


def batch_log(prefix: Path, rank: int) -> list[dict[str, Any]]:
    path = Path(f"{prefix}.rank{rank}")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_until(what: str, done: Callable[[], bool], agents: list[subprocess.Popen[str]]) -> float:
    """Poll until `done`; the time it became true. Fails when an agent ends meanwhile."""
    deadline = time.monotonic() + 90
    while not done():
        if any(agent.poll() is not None for agent in agents):
            assert done(), f"an agent ended before {what}"
            break
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.time()


STARTED: list[subprocess.Popen[str]] = []  # every agent a test started, for its teardown


@pytest.fixture(autouse=True)
def _no_pod_outlives_its_test() -> Iterator[None]:
    yield
    while STARTED:
        agent = STARTED.pop()
        if agent.poll() is None:
            kill_pod(agent)


def start_agent(
    pod: str, command: list[str], env: dict[str, str], logs: Path
) -> subprocess.Popen[str]:
    """An agent (a pod), its output in `logs`/<pod>.log."""
    out = (logs / f"{pod}.log").open("a")
    agent = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    STARTED.append(agent)
    return agent


def kill_pod(agent: subprocess.Popen[str]) -> None:
    """SIGKILL an agent and every process under it, as when its pod or node is lost (torchrun
    starts its ranks in sessions of their own: the agent's process group does not hold them)."""
    pids, unseen = [], [agent.pid]
    while unseen:
        pid = unseen.pop()
        pids.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            unseen.extend(int(child) for child in task.read_text().split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    agent.wait()


def end(agents: list[subprocess.Popen[str]]) -> list[int]:
    """Each agent's exit code, once all have ended (the teardown kills what is left)."""
    return [agent.wait(timeout=support.RUN_TIMEOUT_S) for agent in agents]


def test_a_killed_rank_restarts_in_place_and_the_group_resumes(
    tmp_path: Path, api_server: FakeApiServer, token_file: Path
) -> None:
    """Two pods; rank 1 is SIGKILLed after step 30 (its checkpoint taken): its agent restarts
    it, the other agent follows, both resume at step 31 and finish; one report, of rank 1 and
    137, from the pod that ran it. Prints the time from the kill to the group's next step."""
    log, marker, checkpoints = tmp_path / "batches", tmp_path / "crashed", tmp_path / "ckpt"
    trainer = ["-m", "ddp_trainer", *DIGITS, "--epochs=3", "--checkpoint-every-steps=10"]
    trainer.append(f"--checkpoint-dir={checkpoints}")
    crash = {
        "DDP_TRAINER_CRASH_ONCE_AT_STEP": "30",
        "DDP_TRAINER_CRASH_MARKER": str(marker),
        "DDP_TRAINER_BATCH_LOG": str(log),
    }
    port = free_port()
    agents = [
        start_agent(
            f"mnist-worker-{index}",
            support.agent_command(*trainer, port=port, nnodes="2", host=index == 0),
            support.agent_env(f"mnist-worker-{index}", api_server, token_file, **crash),
            tmp_path,
        )
        for index in range(2)
    ]
    wait_until("the kill", marker.exists, agents)
    killed = marker.stat().st_mtime  # touched just before the rank kills itself
    steps = lambda: [line["step"] for line in batch_log(log, 0)]  # noqa: E731
    back = wait_until("the first step after the restart", lambda: 31 in steps(), agents)
    print(f"\nrank killed -> the group's next step: {back - killed:.1f} s")
    assert end(agents) == [0, 0], (tmp_path / "mnist-worker-1.log").read_text()[-3000:]
    for rank in (0, 1):
        after = [line["step"] for line in batch_log(log, rank)]
        assert after == list(range(1, 70))  # killed after step 30, resumed at 31, not at 1
    outputs = {
        pod: (tmp_path / f"{pod}.log").read_text() for pod in ("mnist-worker-0", "mnist-worker-1")
    }
    [restarted] = [pod for pod, out in outputs.items() if "rank 1 ended with 137" in out]
    [restart] = support.patches_of(api_server, RANK_RESTART_FIELD)
    assert (restart["pod"], restart["rank"], restart["exitCode"]) == (restarted, 1, 137)
    assert restart["count"] == 1 and "killed by SIGKILL" in restart["message"]


def test_an_elastic_group_loses_a_pod_trains_on_and_takes_its_replacement_back(
    tmp_path: Path, api_server: FakeApiServer, token_file: Path
) -> None:
    """Three pods, --nnodes=2:3; pod 2's agent and its rank are SIGKILLed (its node is gone):
    the other two re-form and train on from the newest checkpoint, at world size 2; a
    replacement pod 2 joins at the next re-formation (world size 3 again); all finish."""
    log, checkpoints = tmp_path / "batches", tmp_path / "ckpt"
    trainer = ["-m", "ddp_trainer", *DIGITS, "--epochs=8", "--checkpoint-every-steps=5"]
    trainer.append(f"--checkpoint-dir={checkpoints}")
    hooks = {
        "DDP_TRAINER_BATCH_LOG": str(log),
        "DDP_TRAINER_STEP_SECONDS": "0.1",
        "KUBEDDP_HEARTBEAT_SECONDS": "0.5",
    }
    port = free_port()

    def agent(index: int) -> subprocess.Popen[str]:
        pod = f"mnist-worker-{index}"
        command = support.agent_command(*trainer, port=port, nnodes="2:3", host=index == 0)
        return start_agent(
            pod, command, support.agent_env(pod, api_server, token_file, **hooks), tmp_path
        )

    def world_sizes() -> list[int]:
        return [
            patch["worldSize"]
            for patch in support.patches_of(api_server, "training")
            if "worldSize" in patch
        ]

    agents = [agent(index) for index in range(3)]
    steps = lambda: [line["step"] for line in batch_log(log, 0)]  # noqa: E731
    wait_until("30 steps of 3 ranks", lambda: 3 in world_sizes() and len(steps()) >= 30, agents)
    kill_pod(agents.pop())
    killed_at, reports, lost_at = steps()[-1], len(world_sizes()), time.time()
    shrunk_at = wait_until("2 ranks training", lambda: 2 in world_sizes()[reports:], agents)
    agents.append(agent(2))  # the replacement pod, same name
    reports, replaced_at = len(world_sizes()), time.time()
    grown_at = wait_until("3 ranks training again", lambda: 3 in world_sizes()[reports:], agents)
    print(f"\npod lost -> 2 ranks train: {shrunk_at - lost_at:.1f} s")
    print(f"replacement started -> 3 ranks train: {grown_at - replaced_at:.1f} s")
    outputs = "\n".join(path.read_text()[-2000:] for path in tmp_path.glob("*.log"))
    assert end(agents) == [0, 0, 0], outputs
    after_kill = steps()[steps().index(killed_at) + 1 :]
    assert min(after_kill) > killed_at - 5  # from the newest checkpoint, not from the start
    losses = [line["loss"] for line in batch_log(log, 0)]
    resumed = losses[steps().index(killed_at) + 1]
    assert resumed < 0.8 * losses[0]  # the loss goes on where it was, not back at the start
    assert support.patches_of(api_server, RANK_RESTART_FIELD) == []  # the pod itself was lost
