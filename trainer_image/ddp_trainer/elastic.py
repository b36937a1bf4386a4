"""torch's elastic agent with kube-ddp's rules: a LocalElasticAgent subclass torchrun runs.

The one module of the trainer that extends torch.distributed.elastic. `Agent` overrides the
methods torch's SimpleElasticAgent leaves to its subclasses:

- `_monitor_workers`: after each look at its ranks, a failed group is judged by the job's
  failure rules (`agent`: restart in place, counted or not, reported or not, or stop).
- `_shutdown`: the exit codes of the ranks it stopped are kept (`Hooks.stopped`): torchrun
  keeps them to itself, and the pod ends 86 when SIGTERM stopped ranks that all exited 86.

torch gives torchrun's `launch_agent` no way to take an agent class, nor the rendezvous a way
to take its poll interval: `running` swaps these module names of torch for the run and
restores them after. Each name and signature relied on is pinned to torch 2.15.0 by
tests/unit/test_elastic.py, and the trainer tier runs torchrun under each shipped image's torch
too (tests/trainer/test_image_torch.py). Where a torch lacks a name, or its signature takes
other parameters than the ones used here (`missing`), torchrun runs its own agent, without
restarts in place, and says so.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.launcher import api as launcher

from ddp_trainer import agent, contract
from ddp_trainer.rank_exits import PROG

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

# The names of torch's modules `running` swaps, each (module, name): what launch_agent builds
# its agent with, and the rendezvous's wait between two looks at a forming round and the
# holder of the state it reads.
AGENT_CLASS = (launcher, "LocalElasticAgent")
RENDEZVOUS_DELAY = (dynamic_rendezvous, "_delay")
RENDEZVOUS_STATE = (dynamic_rendezvous, "_BackendRendezvousStateHolder")
SWAPPED = (AGENT_CLASS, RENDEZVOUS_DELAY, RENDEZVOUS_STATE)
# The methods `Agent` overrides.
OVERRIDDEN = ("_monitor_workers", "_shutdown")
# The parameters this module passes by position or name to what torch calls or is called
# through, in that order: each must lead the signature of the torch in use. `_shutdown`
# passes on whatever torch gives it (2.9 gives death_sig, 2.15 a timeout too).
PARAMETERS: tuple[tuple[Any, str, tuple[str, ...]], ...] = (
    (LocalElasticAgent, "_monitor_workers", ("self", "worker_group")),
    (LocalElasticAgent, "_shutdown", ("self",)),
    (dynamic_rendezvous, "_delay", ("seconds",)),
    (
        getattr(dynamic_rendezvous, "_BackendRendezvousStateHolder", None),
        "__init__",
        ("self", "backend", "settings", "cache_duration"),
    ),
)


@dataclass
class Hooks:
    """What the agent of one torchrun run is given beyond torch's arguments."""

    rules: agent.Rules
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    stopped: list[int] = field(default_factory=list)  # the last ranks' codes, once stopped


def missing() -> list[str]:
    """What of torch this module relies on and this torch lacks (torchrun then runs its own
    agent, without restarts in place); empty on the torch it was written against."""
    names = [f"{module.__name__}.{name}" for module, name in SWAPPED if not hasattr(module, name)]
    names += [name for name in OVERRIDDEN if not hasattr(LocalElasticAgent, name)]
    for owner, name, parameters in PARAMETERS:
        function = getattr(owner, name, None) if owner is not None else None  # else named above
        if function is not None and _leading_parameters(function, len(parameters)) != parameters:
            names.append(f"{getattr(owner, '__name__', owner)}.{name}{parameters}")
    return names


def _leading_parameters(function: Any, count: int) -> tuple[str, ...]:
    try:
        parameters = inspect.signature(inspect.unwrap(function)).parameters
    except (TypeError, ValueError):  # no signature to read: taken as not fitting
        return ()
    return tuple(parameters)[:count]


class Agent(LocalElasticAgent):
    """torchrun's agent, its failed groups judged by the job's rules."""

    def __init__(self, *args: Any, hooks: Hooks, **kwargs: Any) -> None:
        self._hooks = hooks
        super().__init__(*args, **kwargs)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result: RunResult = super()._monitor_workers(worker_group)
        if result.state == WorkerState.FAILED and result.failures:
            self._judge(result.failures, worker_group.store)
        return result

    def _judge(self, failures: Mapping[int, ProcessFailure], store: Any) -> None:
        """Set how many restarts torch has left for the group's failure, which its loop then
        takes one off for a restart, or stops on at none."""
        what, rank, code = agent.verdict(failures, self._hooks.rules)
        if what == "preempted":
            print(
                f"{PROG}: every failed rank exited {code} (a peer pod was stopped, the group "
                "saved): restarting in place, not counted",
                file=sys.stderr,
                flush=True,
            )
            self._remaining_restarts += 1  # torch takes one off for this restart
        elif what == "stop":
            self._remaining_restarts = 0  # torch stops its ranks and raises ChildFailedError
        elif self._remaining_restarts > 0:
            print(
                f"{PROG}: rank {rank} ended with {code}: restarting in place "
                f"({self._remaining_restarts} restart(s) left)",
                file=sys.stderr,
                flush=True,
            )
            if code != contract.EXIT_PEER_LOST:
                agent.report_restart(store, rank, code, self._hooks.env)

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        super()._shutdown(*args, **kwargs)
        handlers = getattr(self._pcontext, "subprocess_handlers", None) or {}
        self._hooks.stopped[:] = [handler.proc.returncode for handler in handlers.values()]


def _polls_every(poll_s: float) -> tuple[Any, type[Any]]:
    """The rendezvous's delay and state holder, its looks at a forming round `poll_s` apart
    (agent.rendezvous_poll_s), not torch's second: the wait between two looks, and how long
    a state read serves as the round's state."""
    delay, holder = getattr(*RENDEZVOUS_DELAY), getattr(*RENDEZVOUS_STATE)

    def delay_polls_less(seconds: float | tuple[float, float]) -> None:
        delay(seconds=poll_s if seconds == agent.TORCH_RENDEZVOUS_POLL_S else seconds)

    class StateHolder(holder):  # type: ignore[misc,valid-type]
        def __init__(self, backend: Any, settings: Any, cache_duration: float = poll_s) -> None:
            super().__init__(backend, settings, cache_duration)

    return delay_polls_less, StateHolder


@contextmanager
def rendezvous_polling(poll_s: float) -> Iterator[None]:
    """torch's c10d rendezvous, while in the block, looking at a forming round every `poll_s`."""
    delay, holder = _polls_every(poll_s)
    with _swapped(*RENDEZVOUS_DELAY, delay), _swapped(*RENDEZVOUS_STATE, holder):
        yield


@contextmanager
def running(hooks: Hooks, poll_s: float) -> Iterator[None]:
    """torchrun's `run`, while in the block, with `Agent` given `hooks` and the rendezvous
    polling every `poll_s`."""
    with ExitStack() as stack:
        stack.enter_context(rendezvous_polling(poll_s))
        stack.enter_context(_swapped(*AGENT_CLASS, functools.partial(Agent, hooks=hooks)))
        yield


@contextmanager
def _swapped(module: ModuleType, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)
