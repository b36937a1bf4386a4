"""ddp_trainer.elastic: what it relies on of torch's elastic agent beyond its public API, pinned
to the torch it was written against. Another torch must be read again (torch/distributed/run.py,
launcher/api.py, elastic/agent/server/, elastic/multiprocessing/, elastic/rendezvous/) before
this test's version is moved."""

from __future__ import annotations

import importlib.metadata
import inspect
import signal
import types
from collections.abc import Callable
from typing import Any

import pytest
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import api as processes
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.launcher import api as launcher

from ddp_trainer import agent, elastic


def names_used(function: Callable[..., Any]) -> set[str]:
    """The global and attribute names `function`'s code uses, its comprehensions' included."""
    codes, names = [inspect.unwrap(function).__code__], set[str]()
    while codes:
        code = codes.pop()
        names |= set(code.co_names)
        codes += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return names


def test_written_against_the_pinned_torch() -> None:
    assert importlib.metadata.version("torch").split("+")[0] == "2.15.0"


def test_this_torch_has_all_it_relies_on() -> None:
    assert elastic.missing() == []


# Each method `Agent` overrides or calls, and each function it swaps, as torch 2.15.0 has it.
SIGNATURES = {
    LocalElasticAgent.__init__: "(self, spec: 'WorkerSpec', logs_specs: 'LogsSpecs', "
    "start_method='spawn', exit_barrier_timeout: 'float' = 300, log_line_prefix_template: "
    "'str | None' = None, shutdown_timeout: 'int' = 30, health_check_server: "
    "'HealthCheckServer | None' = None, uninterruptible_state_timeout: 'float | None' = None)",
    LocalElasticAgent._monitor_workers: "(self, worker_group: 'WorkerGroup') -> 'RunResult'",
    LocalElasticAgent._shutdown: "(self, death_sig: 'signal.Signals' = <Signals.SIGTERM: 15>, "
    "timeout: 'int' = 30) -> 'None'",
    dynamic_rendezvous._delay: "(seconds: float | tuple[float, float]) -> None",
    dynamic_rendezvous._BackendRendezvousStateHolder.__init__: "(self, backend: "
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous.RendezvousBackend, settings: "
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous.RendezvousSettings, "
    "cache_duration: int = 1) -> None",
}


@pytest.mark.parametrize("function", SIGNATURES, ids=lambda function: function.__qualname__)
def test_what_the_agent_overrides_or_swaps_has_the_signature_it_was_written_for(
    function: Callable[..., Any],
) -> None:
    assert str(inspect.signature(function)) == SIGNATURES[function]


# Where torch looks up each name `running` swaps, and each attribute of torch's that `Agent`
# reads or writes: (the code that uses it, the name).
USES = [
    (launcher.launch_agent, "LocalElasticAgent"),  # builds its agent by this module name
    (dynamic_rendezvous._DistributedRendezvousOpExecutor.run, "_delay"),  # waits between looks
    (dynamic_rendezvous.DynamicRendezvousHandler.from_backend, "_BackendRendezvousStateHolder"),
    (SimpleElasticAgent.__init__, "_remaining_restarts"),  # the restart budget Agent sets
    (SimpleElasticAgent._invoke_run, "_remaining_restarts"),  # ...and torch's loop reads
    (LocalElasticAgent.__init__, "_pcontext"),  # the ranks Agent._shutdown reads the codes of
    (processes.SubprocessContext.__init__, "subprocess_handlers"),
]


def use_id(item: Any) -> str:
    return str(getattr(item, "__qualname__", item))


@pytest.mark.parametrize(("code", "name"), USES, ids=use_id)
def test_torch_uses_the_names_the_agent_swaps_or_sets_where_it_expects(
    code: Callable[..., Any], name: str
) -> None:
    assert name in names_used(code)


def test_the_run_swaps_torchs_names_and_restores_them() -> None:
    swapped = [getattr(module, name) for module, name in elastic.SWAPPED]
    with elastic.running(elastic.Hooks(agent.Rules()), poll_s=0.1):
        during = [getattr(module, name) for module, name in elastic.SWAPPED]
        assert launcher.LocalElasticAgent.func is elastic.Agent
    assert [getattr(module, name) for module, name in elastic.SWAPPED] == swapped
    assert not any(a is b for a, b in zip(during, swapped, strict=True))


def test_a_torch_whose_hook_takes_other_parameters_is_named_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's agent is run instead of ours where a signature no longer fits, not a crash."""

    def monitor(self: Any, group: Any, timeout: float) -> None: ...

    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", monitor)
    assert elastic.missing() == ["LocalElasticAgent._monitor_workers('self', 'worker_group')"]


def test_the_agent_passes_torchs_shutdown_arguments_on_as_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.9 calls `_shutdown(death_sig)`, 2.15 `_shutdown(death_sig, timeout)`."""
    given: list[tuple[Any, ...]] = []

    def shutdown(self: Any, *args: Any) -> None:
        given.append(args)

    monkeypatch.setattr(LocalElasticAgent, "_shutdown", shutdown)
    agent_ = elastic.Agent.__new__(elastic.Agent)
    agent_._hooks, agent_._pcontext = elastic.Hooks(agent.Rules()), None
    agent_._shutdown()
    agent_._shutdown(signal.SIGKILL)
    agent_._shutdown(signal.SIGTERM, 5)
    assert given == [(), (signal.SIGKILL,), (signal.SIGTERM, 5)]
