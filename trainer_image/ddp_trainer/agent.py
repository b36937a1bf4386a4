"""What a pod's torchrun agent does when one of its ranks fails: restart in place, or stop.

`python -m ddp_trainer.torchrun` runs torchrun with its agent `elastic.Agent` in this process;
this module holds the failure rules of kube-ddp it applies (docs/design.md, "Restarts in place:
what a pod's agent does"). After each look at its ranks, a failed group is judged by the rank
whose failure caused the others (`rank_exits.cause`):

- every failed rank exited 86 (contract.EXIT_PREEMPTED) and this agent was not signalled (a
  signal to it raises out of torch's loop before any look): a peer pod was SIGTERMed and the
  group saved and stopped. Restart in place, not counted against --max-restarts, not reported.
- its code restarts under the job's failure rules (contract.exit_restarts, with
  KUBEDDP_RESTART_POLICY and KUBEDDP_RETRYABLE_EXIT_CODES): torch restarts the ranks and the
  rendezvous re-forms the group with the peers' agents. Unless the code is 88 (a lost peer: the
  consequence of another pod's failure), this agent reports the restart: the first agent of the
  rendezvous round to claim it in the rendezvous store merge-patches status.rankRestart.
- any other code: no restart; torchrun then stops, and the pod exits with the code.

Where this torch lacks what `elastic.Agent` relies on, torchrun runs its own agent without
in-place restarts (--max-restarts=0): the pod then fails as a whole, as the operator expects of
any launcher.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddp_trainer import contract
from ddp_trainer.rank_exits import cause, exit_code, how_it_ended
from ddp_trainer.report import StatusReporter, now_utc, stamp

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

log = logging.getLogger(__name__)

# The agent's own rendezvous settings, unless --rdzv-conf sets them (torch's defaults in
# brackets). A dead agent is dropped from the rendezvous after interval x attempts, 3 s [15 s];
# an elastic group that has its minimum of nodes waits last_call for more before it trains,
# 2 s [30 s]. Each agent writes the rendezvous state once per interval: for hundreds of
# nodes, raise the interval with --rdzv-conf. join_timeout stays torch's 600 s: a replacement
# pod may wait that long for a node and its image while its peers wait for it.
FAST_RENDEZVOUS: Mapping[str, str] = {
    "keep_alive_interval": "1",
    "keep_alive_max_attempt": "3",
    "last_call_timeout": "2",
}
# An agent waiting for its peers in a rendezvous round looks at the round's state again after
# a fixed second, and reads it from the store at most once a second (torch's `_delay(seconds=1)`
# and the state holder's cache_duration in dynamic_rendezvous, both private): most of the
# time a small group takes to re-form. `elastic.rendezvous_polling` shortens it to 0.1 s for a small
# group and keeps a group's reads of the state, which grows with it, near torch's at 100
# nodes: 100 a second in all (1 s from 100 nodes up).
TORCH_RENDEZVOUS_POLL_S = 1.0
FASTEST_RENDEZVOUS_POLL_S = 0.1
GROUP_RENDEZVOUS_POLLS_PER_S = 100
# Keys in the rendezvous store (a PrefixStore per round, over the attempt's TCPStore).
CLAIM_KEY = "kubeddp.rankRestart.claim"  # per round: the agent that reports its restart
COUNT_KEY = "kubeddp.rankRestart.count"  # per store, so per attempt: restarts reported


@dataclass(frozen=True)
class Rules:
    """The failure rules of the job, as the operator passes them to every worker."""

    policy: str = contract.DEFAULT_RESTART_POLICY
    retryable: frozenset[int] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Rules:
        policy = env.get(contract.RESTART_POLICY_ENV) or contract.DEFAULT_RESTART_POLICY
        codes = env.get(contract.RETRYABLE_EXIT_CODES_ENV, "")
        retryable = frozenset(int(code) for code in codes.split(",") if code.strip())
        return cls(policy, retryable)


def with_fast_rendezvous(rdzv_conf: str) -> str:
    """torchrun's --rdzv-conf (`key=value,...`) with FAST_RENDEZVOUS's keys it does not set."""
    given = {item.split("=", 1)[0].strip() for item in rdzv_conf.split(",") if item.strip()}
    added = [f"{key}={value}" for key, value in FAST_RENDEZVOUS.items() if key not in given]
    return ",".join(part for part in (rdzv_conf, *added) if part)


def rendezvous_poll_s(nnodes: str) -> float:
    """Seconds between an agent's looks at a forming round, for torchrun's --nnodes (`N` or
    `MIN:MAX`): the group's largest size over GROUP_RENDEZVOUS_POLLS_PER_S, 0.1 s to 1 s."""
    largest = int(nnodes.rsplit(":", maxsplit=1)[-1])
    poll_s = max(FASTEST_RENDEZVOUS_POLL_S, largest / GROUP_RENDEZVOUS_POLLS_PER_S)
    return min(TORCH_RENDEZVOUS_POLL_S, poll_s)


def verdict(failures: Mapping[int, ProcessFailure], rules: Rules) -> tuple[str, int, int]:
    """("preempted" | "restart" | "stop", the causing global rank, its exit code)."""
    rank, failure = cause(failures)
    code = exit_code(failure.exitcode)
    if all(exit_code(ended.exitcode) == contract.EXIT_PREEMPTED for ended in failures.values()):
        return "preempted", rank, code
    if contract.exit_restarts(code, rules.policy, rules.retryable):
        return "restart", rank, code
    return "stop", rank, code


def report_restart(store: Any, rank: int, code: int, env: Mapping[str, str]) -> None:
    """Claim this round's restart in the rendezvous store and, if this agent is first, patch
    status.rankRestart in a thread of its own: the restart does not wait for the API server."""
    me = f"{env.get(contract.POD_NAME, '')}/{os.getpid()}"
    try:
        if store.compare_set(CLAIM_KEY, "", me).decode() != me:
            return  # another agent of this round reports it
        count = counter_store(store).add(COUNT_KEY, 1)
    except Exception as exc:  # the store is gone: the rendezvous then fails, and says so
        log.warning("not reporting the restart of rank %d: %s", rank, exc)
        return
    patch = rank_restart_patch(rank=rank, code=code, count=count, env=env)
    reporter = StatusReporter.from_env(env)
    if reporter is not None:
        threading.Thread(target=reporter.report, args=(patch, True), name="rankRestart").start()


def counter_store(store: Any) -> Any:
    """The attempt's store under the round's prefix, where torch exposes it (2.15 does); else
    the round's, whose count starts again each round: the operator, which takes only a count
    above the last it folded, would then see an attempt's first in-place restart only."""
    return getattr(store, "underlying_store", None) or store


def rank_restart_patch(
    *, rank: int, code: int, count: int, env: Mapping[str, str]
) -> dict[str, Any]:
    """The merge patch of status.rankRestart (the operator's api.RankRestart)."""
    pod = env.get(contract.POD_NAME, "")
    ended = how_it_ended(contract.SIGNALLED - code if code > contract.SIGNALLED else code)
    restart = {
        "attempt": int(env.get(contract.ATTEMPT) or 0),
        "count": count,
        "time": stamp(now_utc()),
        "pod": pod,
        "node": env.get(contract.NODE_NAME, ""),
        "rank": rank,
        "exitCode": code,
        "message": f"rank {rank} in pod {pod} {ended}: its group restarted in place",
    }
    return {"status": {contract.RANK_RESTART_FIELD: restart}}
