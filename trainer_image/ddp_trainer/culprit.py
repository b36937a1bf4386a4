"""Which rank stopped first, when a collective times out or a peer goes away.

At 100 ranks each one times out at its own moment, and the first rank to fail is rarely the one
that hung: it is a healthy one that waited on it. So every rank keeps one entry in the group's
store (the c10d store all ranks already share), rewritten by a daemon thread every `interval`
seconds: how many collectives it has started (the process group's sequence number), its
training step, the time, its pod and node. A healthy rank blocked in a collective keeps writing
(the thread runs while the main thread waits); a stopped or dead process does not; a rank hung in
its own code (a data loader, a deadlock) writes on, but its collectives fall behind. The rank
that ends for a lost peer reads every entry and names the one that fell behind first: fewest
collectives started, then the oldest entry.

A backend that keeps no sequence numbers (torch's base `Backend` raises "does not yet support
sequence numbers"; an out-of-tree one such as Gaudi's HCCL may) leaves the count unknown: the
ledger then compares training steps instead, says so once, and training goes on.

Cost per rank: one store write of about 100 bytes (25 us on a local store) every `interval`
(30 s by default: the heartbeat's), a thread that sleeps in between, and nothing on the
training step itself but an integer assignment (about 40 ns). Reading happens only on the way
out, one store round trip per rank (about 120 us on a local store).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from ddp_trainer import contract
from ddp_trainer.report import Heartbeat

log = logging.getLogger("ddp_trainer")

KEY_PREFIX = "kubeddp/progress/"
# A rank that made no step for this share of the collective timeout logs its threads' Python
# stacks (once per stall): where a rank hung in its own code is, before its peers time out and
# the group's pods are deleted. Healthy ranks waiting on it log theirs too: in a collective.
STALL_SHARE = 0.8
# What a stalled job of one rank is told: nothing else in the job can be the cause.
ALONE = (
    "the job's only rank, in its own code (a data read, a deadlock, its device): its stack is "
    "in its log"
)
READ_TIMEOUT_S = 5.0  # a store that does not answer: its host (rank 0, or torchrun) is gone


def key(rank: int) -> str:
    return f"{KEY_PREFIX}{rank}"


@dataclass(frozen=True)
class Entry:
    """One rank's last sign of progress."""

    rank: int
    collectives: int | None  # started so far in the default group (None: the backend counts none)
    step: int  # training steps done (the trainer's global step; 0 for a program's own)
    at: float  # Unix time of the entry
    pod: str
    node: str
    started: int | None = None  # steps begun (the one in progress counts); None: as `step`
    # the rank's own time per step (its forward pass, no collective in it), a moving average:
    # what tells a straggler, whose peers wait for it in the all-reduce and so step as slowly
    compute_ms: float | None = None

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes | str) -> Entry:
        return cls(**json.loads(data))


def _counts_collectives(entries: Sequence[Entry]) -> bool:
    return all(entry.collectives is not None for entry in entries)


def _progress(entry: Entry, by_collectives: bool) -> int:
    """Collectives started; else steps begun: a rank blocked in a step's all-reduce has begun
    it, a rank hung before it (in its data loader, between epochs) has not."""
    if by_collectives and entry.collectives is not None:
        return entry.collectives
    return entry.step if entry.started is None else entry.started


def behind_first(entries: Sequence[Entry]) -> Entry:
    """The rank that fell behind first: fewest collectives started (training steps where the
    backend counts none), then the oldest entry."""
    by_collectives = _counts_collectives(entries)
    return min(entries, key=lambda e: (_progress(e, by_collectives), e.at, e.rank))


@dataclass(frozen=True)
class Suspect:
    """The rank that stopped first, and how it is known."""

    entry: Entry
    facts: str  # "1 collective(s) behind the others; silent for 75 s (...)"
    alone: bool = False  # the job's only rank: no peers to have stopped before

    def line(self) -> str:
        first = self.entry
        where = f"rank {first.rank} (pod {first.pod}, node {first.node})"
        return (
            f"{where} stopped{'' if self.alone else ' first'}, at step {first.step}: {self.facts}"
        )


def suspect(
    entries: Sequence[Entry], world_size: int, now: float, interval: float
) -> Suspect | None:
    """The rank that fell behind or went silent first; None when every rank was heard from
    lately at the same progress (or none could be read)."""
    if not entries:
        return None
    if world_size == 1:  # no peer waits with it, and no network between them
        alone = entries[0]
        facts = [ALONE]
        if now - alone.at > 2 * interval:
            facts.append(f"silent for {now - alone.at:.0f} s (its ledger's thread stopped too)")
        return Suspect(alone, "; ".join(facts), alone=True)
    heard = {entry.rank for entry in entries}
    silent = [rank for rank in range(world_size) if rank not in heard]
    first = behind_first(entries)
    by_collectives = _counts_collectives(entries)
    unit = "collective(s)" if by_collectives else "step(s)"
    behind = max(_progress(e, by_collectives) for e in entries) - _progress(first, by_collectives)
    age = now - first.at
    facts = []
    if behind:
        facts.append(f"{behind} {unit} behind the others")
    if age > 2 * interval:
        facts.append(f"silent for {age:.0f} s (its process stopped or its node is gone)")
    if silent:
        facts.append(f"rank(s) {', '.join(map(str, silent[:8]))} left no entry at all")
    return Suspect(first, "; ".join(facts)) if facts else None


def describe(entries: Sequence[Entry], world_size: int, now: float, interval: float) -> str:
    """One line naming the rank that stopped first, and how it is known."""
    if not entries:
        return "no rank's progress could be read from the group's store"
    found = suspect(entries, world_size, now, interval)
    if found is not None:
        return found.line()
    by_collectives = _counts_collectives(entries)
    unit = "collective(s)" if by_collectives else "step(s)"
    ahead = max(_progress(entry, by_collectives) for entry in entries)
    return (
        f"no rank fell behind: all {len(entries)} were at {ahead} {unit} and were "
        f"heard from within {2 * interval:.0f} s (the network, not a rank?)"
    )


STRAGGLER_RATIO = contract.STRAGGLER_RATIO
# It must be so (or no longer so) at this many checks in a row before it is said: no flapping.
STRAGGLER_CHECKS = 2
COMPUTE_SMOOTHING = 0.2  # the weight of the newest step in `compute_ms`


def slowest(entries: Sequence[Entry]) -> tuple[Entry, float] | None:
    """The rank whose own time per step is the longest, and how many times the median of the
    others' it is; None with fewer than two ranks timed."""
    timed = [e for e in entries if e.compute_ms is not None and e.compute_ms > 0]
    if len(timed) < 2:
        return None
    worst = max(timed, key=lambda e: (e.compute_ms or 0.0, -e.rank))
    others = sorted(e.compute_ms or 0.0 for e in timed if e is not worst)
    middle = len(others) // 2
    median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
    return worst, (worst.compute_ms or 0.0) / median


def straggler_fields(entry: Entry, ratio: float) -> dict[str, Any]:
    """status.training.straggler: the rank, its pod and node, and how much slower it is."""
    return {
        "rank": entry.rank,
        "pod": entry.pod,
        "node": entry.node,
        "slowerBy": round(min(ratio, contract.MAX_METRIC), 2),
        "message": f"rank {entry.rank} (pod {entry.pod}, node {entry.node}) takes {ratio:.1f}x "
        f"the median time of the other ranks' own part of a step ({entry.compute_ms:.1f} ms a "
        "step): the group waits for it at every all-reduce",
    }


# Called with what rank 0 found in a stall (`stall_fields`).
OnStall = Callable[[dict[str, Any]], object]
# Called with a straggler found (`straggler_fields`), or None when it is one no more.
OnStraggler = Callable[[dict[str, Any] | None], object]


def stall_fields(found: Suspect | None, line: str) -> dict[str, Any]:
    """status.training.stall: the suspect's rank, pod, node and step (all null: every rank
    was even and heard from) and the line that says so."""
    entry = None if found is None else found.entry
    return {
        "rank": None if entry is None else entry.rank,
        "pod": None if entry is None else entry.pod,
        "node": None if entry is None else entry.node,
        "step": None if entry is None else entry.step,
        "message": line[: contract.MESSAGE_LENGTH],
    }


class Ledger:
    """This rank's entry in the store, rewritten every `interval` seconds by a daemon thread."""

    def __init__(
        self,
        store: Any,
        sequence: Callable[[], int | None],
        rank: int,
        interval: float,
        pod: str,
        node: str,
        stall_after: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.sequence = sequence
        self.rank = rank
        self.interval = interval
        self.pod = pod
        self.node = node
        self.clock = clock
        self.step = 0  # set by the training loop: a plain assignment per step
        self.compute_ms: float | None = None  # likewise (`timed`), where the loop measures it
        self.started: int | None = None  # likewise, as a step begins, where the loop says
        self.stall_after = stall_after
        self._seen = (self.step, clock())  # the last step seen by the thread, and when
        self._dumped = False
        self._watch: tuple[int, OnStall, OnStraggler | None] | None = None  # rank 0's
        self._told: str | None = None  # what was last told, in this stall
        self._straggler: int | None = None  # the rank said to straggle, if any
        self._seen_slow: tuple[int | None, int] = (None, 0)  # the slowest rank, checks in a row
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubeddp-ledger", daemon=True)

    def entry(self) -> Entry:
        return Entry(
            self.rank,
            self.sequence(),
            self.step,
            self.clock(),
            self.pod,
            self.node,
            self.started,
            None if self.compute_ms is None else round(self.compute_ms, 3),
        )

    def timed(self, seconds: float | None) -> None:
        """This rank's own part of a step took `seconds` (the training loop's measure; None:
        not known yet)."""
        if seconds is None:
            return
        ms = seconds * 1000
        last = self.compute_ms
        self.compute_ms = ms if last is None else last + COMPUTE_SMOOTHING * (ms - last)

    def write(self) -> None:
        self.store.set(key(self.rank), self.entry().encode())

    def start(self) -> Ledger:
        self.write()  # a rank that hangs before the first interval still has an entry
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread, waiting for a write in flight: a daemon thread still inside a store
        call when the interpreter finalizes is ended in C++ frames (std::terminate, SIGABRT)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(READ_TIMEOUT_S)

    def watch(
        self, world_size: int, on_stall: OnStall, on_straggler: OnStraggler | None = None
    ) -> None:
        """Rank 0's: when no step was made for an interval, read every rank's entry and tell
        `on_stall` which rank the group waits on, or that every rank is even and alive (a long
        validation, or a collective all of them wait in); again when that changes. And every
        interval, tell `on_straggler` of a rank whose own time per step stays `STRAGGLER_RATIO`
        times the others' median (`STRAGGLER_CHECKS` checks in a row), and when it recovers.
        What it costs: a read of each rank's entry an interval on rank 0 (one round trip each,
        about 120 us on a local store), and a report only when what is found changes."""
        self._watch = (world_size, on_stall, on_straggler)

    @property
    def watching(self) -> bool:
        return self._watch is not None

    def _period(self) -> float:
        """Rank 0 watching wakes twice an interval: it finds the rank a stall waits on within
        one and a half intervals of the stall, before the operator's wait for it ends."""
        period = self.interval / 2 if self.watching else self.interval
        return min(period, self.stall_after or period)

    def _run(self) -> None:
        while not self._stopped.wait(self._period()):
            self.check_stall()
            try:
                self.write()
                self.check_group()
                self.check_stragglers()
            except Exception as exc:  # the store's host is gone: the group is ending anyway
                log.debug("progress ledger: %s", exc)
                return

    def check_group(self) -> str | None:
        """What rank 0 finds when no step was made for an interval (the line it told)."""
        step, since = self._seen
        now = self.clock()
        if self._watch is None or self.step != step or now - since < self.interval:
            self._told = None  # no stall, or a new one
            return None
        world_size, on_stall, _ = self._watch
        entries = peek_entries(self.store, world_size)
        if not entries:
            return None
        found = suspect(entries, world_size, now, self.interval)
        line = describe(entries, world_size, now, self.interval)
        if line != self._told:
            self._told = line
            on_stall(stall_fields(found, line))
        return line

    def check_stragglers(self) -> int | None:
        """Rank 0's: the rank said to straggle now, if any, told when that changes."""
        world_size, _, on_straggler = self._watch or (0, None, None)
        if on_straggler is None:
            return None
        found = slowest(peek_entries(self.store, world_size))
        slow = found is not None and found[1] >= STRAGGLER_RATIO
        rank = found[0].rank if found is not None and slow else None
        seen, times = self._seen_slow
        self._seen_slow = (rank, times + 1 if rank == seen else 1)
        if self._seen_slow[1] < STRAGGLER_CHECKS or rank == self._straggler:
            return self._straggler
        self._straggler = rank
        on_straggler(None if found is None or rank is None else straggler_fields(*found))
        return rank

    def check_stall(self) -> bool:
        """Log every thread's Python stack once when no step was made for `stall_after`."""
        step, since = self._seen
        now = self.clock()
        if self.step != step:
            self._seen, self._dumped = (self.step, now), False
            return False
        if self.stall_after is None or self._dumped or now - since < self.stall_after:
            return False
        self._dumped = True
        print(
            f"ddp_trainer[rank {self.rank}]: no step for {now - since:.0f} s (at step {step}); "
            "the stacks of this rank's threads:",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        return True


def read_entries(store: Any, world_size: int) -> list[Entry]:
    """Every rank's entry the store still holds; stops at the first that does not answer."""
    store.set_timeout(timedelta(seconds=READ_TIMEOUT_S))
    entries = []
    for rank in range(world_size):
        try:
            if store.check([key(rank)]):
                entries.append(Entry.decode(store.get(key(rank))))
        except Exception as exc:
            log.warning("progress ledger: the store did not answer for rank %d: %s", rank, exc)
            break
    return entries


def peek_entries(store: Any, world_size: int) -> list[Entry]:
    """Every rank's entry the store holds now, without waiting for one that is missing and
    without changing the store's timeout, which the process group shares."""
    names = [key(rank) for rank in range(world_size)]
    return [Entry.decode(store.get(name)) for name in names if store.check([name])]


def identity(env: Mapping[str, str]) -> tuple[str, str]:
    """This rank's pod and node, from the downward API kube-ddp sets; the host's name else."""
    host = socket.gethostname()
    return env.get(contract.POD_NAME) or host, env.get(contract.NODE_NAME) or host


def start_ledger(
    rank: int, env: Mapping[str, str] = os.environ, stall_after: float | None = None
) -> Ledger:
    """This rank's ledger on the default group's store (call after init_process_group); a
    rank without a group (a world of one) keeps its ledger in a store of its own."""
    import torch.distributed as dist

    pod, node = identity(env)
    interval = Heartbeat.every_from_env(env)  # the heartbeat's interval
    if dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        sequence = collectives_counter(dist.distributed_c10d._get_default_group())
    else:
        store = dist.HashStore()  # type: ignore[attr-defined]
        sequence = _unknown  # no collectives to count
    return Ledger(store, sequence, rank, interval, pod, node, stall_after).start()


def collectives_counter(group: Any) -> Callable[[], int | None]:
    """The count of collectives this rank has started, where the backend keeps one (gloo and
    NCCL do); else a counter that knows none, said once."""
    try:
        count: Callable[[], int] = group._get_sequence_number_for_group  # not in torch's stubs
        count()
    except (RuntimeError, AttributeError) as exc:
        log.warning(
            "progress ledger: the %s process group keeps no count of collectives (%s): a lost "
            "rank will be named from the training steps and the age of each rank's entry",
            _backend_name(group),
            exc,
        )
        return _unknown
    return count


def _backend_name(group: Any) -> str:
    import torch.distributed as dist

    try:
        return str(dist.get_backend(group))
    except Exception:  # a backend without a name: say nothing wrong
        return "default"


def _unknown() -> None:
    return None


def name_the_culprit(ledger: Ledger, world_size: int) -> str:
    """The line that says which rank stopped first, read from every rank's entry."""
    ledger.stop()
    entries = read_entries(ledger.store, world_size)
    return describe(entries, world_size, time.time(), ledger.interval)
