"""Rank interpreters started before their ranks are known, so torch is imported meanwhile.

torchrun starts a rank (`python -u -m MODULE ...` or `python -u SCRIPT ...`) only once the
rendezvous has formed the group, and each rank then spends seconds importing torch: on a
replacement pod after its agent's own import, on a restart in place after the re-formation.
So `python -m ddp_trainer.torchrun` has one interpreter per local rank ready before the
rendezvous ends. As it starts, it imports torch and forks them from itself (no thread of its
own runs yet; their pages are shared until written). On a restart, its rendezvous threads
running, it starts them as `python -u -m ddp_trainer.warm` once it has stopped the old ranks
(their memory is free again), and each imports torch while the agent waits in the rendezvous.
Meanwhile a rank of kube-ddp's trainer imports the trainer's modules and its dataset's too
(`prepare`); then it waits on its stdin. When torchrun starts a rank, `WarmRanks` hands one of
them the rank's command and environment (a JSON line), and torchrun keeps it as the rank's
process: the agent's child, in a session of its own, as torchrun's own would be. The agent
(`elastic.Agent`) prepares them each time it forms its group and takes its ranks from them.

A rank is started cold, as torchrun does, wherever a warm one could differ from it: torchrun
writes the rank's output to files (--redirects, --tee), the command is not one of the two
forms above with this agent's interpreter (--no-python, a NUMA wrapper), or the agent's own
environment changed since the interpreter started. Only what torch's agent sets may differ:
the rank's own variables (RANK, WORLD_SIZE, MASTER_ADDR...) and its TORCHELASTIC_ settings,
read when the group forms or a rank fails, not when torch is imported.
DDP_TRAINER_WARM_RANKS=0 turns it off. Differences that stay: `/proc/PID/environ` of a warm
rank shows the environment its interpreter started with, not the rank's, and a forked rank's
command line (`ps`) is its agent's.
"""

from __future__ import annotations

import io
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import BinaryIO

MODULE = "ddp_trainer.warm"
TRAINER = "ddp_trainer"  # the module of kube-ddp's trainer, whose rank prepares more
ENABLE_ENV = "DDP_TRAINER_WARM_RANKS"
UNBUFFERED = "-u"  # torchrun runs every Python rank unbuffered
# torch's agent sets these in its own environment as it starts (its settings, which torch reads
# when a rank runs, not when it is imported): an interpreter started before may lack them.
AGENT_SETTINGS_PREFIX = "TORCHELASTIC_"
WAIT_POLL_S = 0.01


def enabled(env: Mapping[str, str]) -> bool:
    return env.get(ENABLE_ENV, "1") != "0"


def python_executable(env: Mapping[str, str]) -> str:
    """The interpreter torchrun starts its ranks with."""
    return env.get("PYTHON_EXEC", sys.executable)


class Forked:
    """A rank's interpreter forked from the agent, as much of a `subprocess.Popen` as torchrun
    uses (pid, poll, wait, returncode, signals), and its stdin."""

    def __init__(self, pid: int, stdin: BinaryIO) -> None:
        self.pid = pid
        self.stdin: BinaryIO | None = stdin
        self.returncode: int | None = None
        self._lock = threading.Lock()  # torchrun polls from its monitor and its shutdown

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(WAIT_POLL_S)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class WarmRanks:
    """The agent's side: interpreters waiting to become its next ranks."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.waiting: list[subprocess.Popen[bytes] | Forked] = []
        self.started_in: dict[str, str] = {}

    def fork(self, count: int, command: Sequence[str]) -> bool:
        """`count` interpreters forked from this one, the agent, which has imported torch and
        started no thread of its own yet, for ranks torchrun will start with `command`: True
        in each of them, prepared (the caller then returns `serve()`), False in the agent.
        Nothing started where no warm interpreter could run such a rank, or not this one."""
        if self.python != sys.executable or not self._runnable(command):
            return False
        self.close()
        self.started_in = dict(os.environ)
        for _ in range(count):
            read, write = os.pipe()
            with warnings.catch_warnings():
                # Python 3.12 warns of any other thread: here OpenBLAS's pool (numpy's), which
                # its own fork handlers stop and restart.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                for sibling in self.waiting:  # their pipes: EOF for each once the agent is gone
                    if sibling.stdin is not None:
                        sibling.stdin.close()
                self.waiting = []
                os.close(write)
                os.dup2(read, 0)
                os.close(read)
                os.setsid()  # a session of its own, as torchrun's ranks
                _unbuffered()
                prepare(command[2:])
                return True
            os.close(read)
            self.waiting.append(Forked(pid, os.fdopen(write, "wb")))
        return False

    def prepare(self, count: int, command: Sequence[str]) -> None:
        """`count` interpreters for the next ranks, which torchrun will start with `command`:
        those waiting, if as many wait and live; none where no warm one could run them."""
        if len(self.waiting) == count and all(proc.poll() is None for proc in self.waiting):
            return
        self.close()
        if not self._runnable(command):
            return
        self.started_in = dict(os.environ)
        self.waiting = [
            subprocess.Popen(
                [self.python, UNBUFFERED, "-m", MODULE, *command[2:]],
                stdin=subprocess.PIPE,
                env=self.started_in,
                start_new_session=True,  # as torchrun's own: it signals the rank's group
            )
            for _ in range(count)
        ]

    def take(
        self, command: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.Popen[bytes] | Forked | None:
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
        unchanged = _without_agent_settings(os.environ) == _without_agent_settings(self.started_in)
        return self._runnable(command) and unchanged

    def _runnable(self, command: Sequence[str]) -> bool:
        """Whether `command` is `python -u -m MODULE ...` or `python -u SCRIPT ...` with this
        agent's interpreter: the two forms a warm one runs."""
        return (
            len(command) >= 3
            and command[0] == self.python
            and command[1] == UNBUFFERED
            and (command[2] != "-m" or len(command) >= 4)
        )


def _without_agent_settings(env: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith(AGENT_SETTINGS_PREFIX)}


def prepare(argv: Sequence[str]) -> None:
    """What a rank of `argv` (`-m MODULE ...` or `SCRIPT ...`) can do before it knows its
    group: for kube-ddp's trainer, import its modules and its dataset's (`train.prepare`).
    Other programs: nothing beyond torch, which is all that is known to be safe to import."""
    if list(argv[:2]) == ["-m", TRAINER]:
        from ddp_trainer.train import prepare as prepare_trainer

        prepare_trainer(argv[2:])


def run(argv: Sequence[str]) -> None:
    """Run a rank as `python -u` would with these arguments: `-m MODULE ...` or `SCRIPT ...`."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


def serve() -> int:
    """Wait for the rank's command and environment on stdin, then run it; 0 at once where
    the agent went away or needed no rank of this interpreter."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return 0
        line += chunk
    order = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(order["env"])
    run(order["argv"])
    return 0


def _unbuffered() -> None:
    """stdout and stderr as `python -u` makes them, in an interpreter forked from one that
    was not started so: a rank's lines reach the pod's log as it writes them."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        stream.flush()
        raw = io.FileIO(stream.fileno(), "w", closefd=False)
        text = io.TextIOWrapper(
            raw, encoding=stream.encoding, errors=stream.errors, write_through=True
        )
        setattr(sys, name, text)
        setattr(sys, f"__{name}__", text)


def main() -> int:
    """`python -u -m ddp_trainer.warm RANK_ARGV...`: an interpreter the agent started on a
    restart, for a rank of RANK_ARGV (its command without `python -u`)."""
    import torch  # noqa: F401  (the reason this process starts early)

    prepare(sys.argv[1:])
    return serve()


if __name__ == "__main__":
    sys.exit(main())
