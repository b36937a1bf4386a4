"""Rank interpreters started before their ranks are known, so torch is imported meanwhile.

torchrun starts a rank (`python -u -m MODULE ...` or `python -u SCRIPT ...`) only once the
rendezvous has formed the group, and each rank then spends seconds importing torch: on a
replacement pod after its agent's own import, on a restart in place after the re-formation.
`python -m ddp_trainer.torchrun` starts one interpreter per local rank instead as it starts
(while it imports torch itself) and, on a restart, once it has stopped the old ranks (their
memory is free again); each imports torch while the agent waits in the rendezvous, then waits
on its stdin. When torchrun starts a rank, `WarmRanks` hands one of them the rank's command and
environment (a JSON line), and torchrun keeps it as the rank's process: its own child, in a
session of its own, as torchrun's would be.

A rank is started cold, as torchrun does, wherever a warm one could differ from it: torchrun
writes the rank's output to files (--redirects, --tee), the command is not one of the two
forms above with this agent's interpreter (--no-python, a NUMA wrapper), or the agent's own
environment changed since the interpreter started. Only what torch's agent sets may differ:
the rank's own variables (RANK, WORLD_SIZE, MASTER_ADDR...) and its TORCHELASTIC_ settings,
read when the group forms or a rank fails, not when torch is imported.
DDP_TRAINER_WARM_RANKS=0 turns it off. One difference stays: `/proc/PID/environ` of a warm
rank shows the environment its interpreter started with, not the rank's.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

MODULE = "ddp_trainer.warm"
ENABLE_ENV = "DDP_TRAINER_WARM_RANKS"
UNBUFFERED = "-u"  # torchrun runs every Python rank unbuffered
# torch's agent sets these in its own environment as it starts (its settings, which torch reads
# when a rank runs, not when it is imported): an interpreter started before may lack them.
AGENT_SETTINGS_PREFIX = "TORCHELASTIC_"


def enabled(env: Mapping[str, str]) -> bool:
    return env.get(ENABLE_ENV, "1") != "0"


def python_executable(env: Mapping[str, str]) -> str:
    """The interpreter torchrun starts its ranks with."""
    return env.get("PYTHON_EXEC", sys.executable)


class WarmRanks:
    """The agent's side: interpreters waiting to become its next ranks."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.waiting: list[subprocess.Popen[bytes]] = []
        self.started_in: dict[str, str] = {}

    def prepare(self, count: int) -> None:
        """`count` interpreters for the next ranks: those waiting, if as many wait and live."""
        if len(self.waiting) == count and all(proc.poll() is None for proc in self.waiting):
            return
        self.close()
        self.started_in = dict(os.environ)
        self.waiting = [
            subprocess.Popen(
                [self.python, UNBUFFERED, "-m", MODULE],
                stdin=subprocess.PIPE,
                env=self.started_in,
                start_new_session=True,  # as torchrun's own: it signals the rank's group
            )
            for _ in range(count)
        ]

    def take(
        self, command: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.Popen[bytes] | None:
        """A waiting interpreter told to run `command` with `env`, or None: torchrun then
        starts the rank itself. After a None no interpreter is left waiting."""
        proc = self.waiting.pop(0) if self.waiting else None
        if proc is not None and proc.poll() is None and self._fits(command):
            order = {"argv": list(command[2:]), "env": dict(env)}
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(order).encode() + b"\n")
                proc.stdin.close()
                return proc
            except OSError:  # it died since: start the rank cold
                pass
        if proc is not None:
            self.waiting.append(proc)
        self.close()
        return None

    def close(self) -> None:
        """End the interpreters still waiting (they have run nothing of the user's)."""
        for proc in self.waiting:
            proc.kill()
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        self.waiting = []

    def _fits(self, command: Sequence[str]) -> bool:
        return (
            len(command) >= 3
            and command[0] == self.python
            and command[1] == UNBUFFERED
            and (command[2] != "-m" or len(command) >= 4)
            and _without_agent_settings(os.environ) == _without_agent_settings(self.started_in)
        )


def _without_agent_settings(env: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith(AGENT_SETTINGS_PREFIX)}


def install(ranks: WarmRanks) -> bool:
    """Have torchrun take its ranks from `ranks`, and `ranks` prepare them each time the agent
    forms its group: at its start and on each restart (a failure or a change of its members),
    once the old ranks are stopped (their memory is free), before the rendezvous. False where
    this torch lacks either hook (torchrun then starts every rank itself)."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    handler = getattr(subprocess_handler, "SubprocessHandler", None)
    popen = getattr(handler, "_popen", None)
    initialize = getattr(SimpleElasticAgent, "_initialize_workers", None)
    if handler is None or popen is None or initialize is None:
        return False

    def popen_warm(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        to_terminal = (
            getattr(self, "_stdout", None) is None and getattr(self, "_stderr", None) is None
        )
        proc = ranks.take(args, env) if to_terminal else None
        if proc is None:
            ranks.close()
            return popen(self, args, env)
        return proc

    def prepare_and_initialize(self: Any, worker_group: Any) -> Any:
        ranks.prepare(worker_group.spec.local_world_size)
        return initialize(self, worker_group)

    handler._popen = popen_warm
    SimpleElasticAgent._initialize_workers = prepare_and_initialize  # type: ignore[method-assign]
    return True


def run(argv: Sequence[str]) -> None:
    """Run a rank as `python -u` would with these arguments: `-m MODULE ...` or `SCRIPT ...`."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


def main() -> int:
    import torch  # noqa: F401  (the reason this process starts early)

    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # the agent needed no rank of this interpreter
    order = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(order["env"])
    run(order["argv"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
