"""Naming the rank that stopped first, from each rank's last entry in the group's store."""

from __future__ import annotations

import dataclasses
import threading
import time

from ddp_trainer.culprit import Entry, Ledger, describe

NOW = 1000.0


def entry(rank: int, collectives: int | None, age: float, step: int = 40) -> Entry:
    return Entry(rank, collectives, step, NOW - age, f"job-worker-{rank}", f"node-{rank}")


def test_a_stopped_process_is_the_one_silent_since() -> None:
    """SIGSTOP, a dead node: the process writes no more, while its waiting peers do."""
    entries = [entry(0, 120, 1), entry(1, 120, 65, step=39), entry(2, 120, 2)]
    said = describe(entries, 3, NOW, interval=5)
    assert said.startswith("rank 1 (pod job-worker-1, node node-1) stopped first, at step 39")
    assert "silent for 65 s" in said


def test_a_rank_hung_in_its_own_code_falls_behind_in_collectives() -> None:
    """A data loader or a deadlock: its ledger thread writes on, its collectives stop."""
    entries = [entry(0, 121, 1), entry(1, 121, 2), entry(2, 119, 1)]
    said = describe(entries, 3, NOW, interval=5)
    assert said.startswith("rank 2 (pod job-worker-2, node node-2) stopped first")
    assert "2 collective(s) behind the others" in said
    assert "silent" not in said


def test_a_rank_without_an_entry_is_named_and_equal_ranks_blame_none() -> None:
    assert "rank(s) 2 left no entry" in describe([entry(0, 5, 1), entry(1, 5, 1)], 3, NOW, 5)
    same = describe([entry(0, 5, 1), entry(1, 5, 2)], 2, NOW, 5)
    assert same.startswith("no rank fell behind")


def test_without_a_count_of_collectives_the_steps_tell() -> None:
    """A backend that keeps no sequence numbers (torch's base Backend, maybe Gaudi's HCCL):
    the rank whose training steps fell behind is named, in steps."""
    entries = [entry(0, None, 1, step=52), entry(1, None, 2, step=50), entry(2, None, 1, step=52)]
    said = describe(entries, 3, NOW, interval=5)
    assert said.startswith("rank 1 (pod job-worker-1, node node-1) stopped first, at step 50")
    assert "2 step(s) behind the others" in said
    # All done with step 13; ranks 0 and 2 wait in step 14's all-reduce, rank 1 never began it.
    begun = [
        dataclasses.replace(entry(rank, None, 1, step=13), started=14 - (rank == 1))
        for rank in range(3)
    ]
    said = describe(begun, 3, NOW, interval=5)
    assert said.startswith("rank 1 (pod job-worker-1, node node-1) stopped first, at step 13")
    assert "1 step(s) behind the others" in said
    same = [entry(0, None, 1, step=52), entry(1, None, 2, step=52)]
    assert describe(same, 2, NOW, 5).startswith("no rank fell behind: all 2 were at 52 step(s)")


class SlowStore:
    """A store whose writes take `seconds`, as rank 0's does while it tears its group down."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.writes = 0

    def set(self, key: str, value: str) -> None:
        time.sleep(self.seconds)
        self.writes += 1


def test_stopping_the_ledger_waits_for_its_write_in_flight() -> None:
    """A daemon thread still inside a store call when the interpreter finalizes is ended
    there, through C++ frames: std::terminate, and a finished rank exits 134 (SIGABRT,
    "terminate called without an active exception") instead of 0."""
    store = SlowStore(0.3)
    ledger = Ledger(store, lambda: 0, 0, interval=0.01, pod="pod", node="node").start()
    time.sleep(0.1)  # its thread is in its second write
    ledger.stop()
    assert not [t for t in threading.enumerate() if t.name == "kubeddp-ledger"]
    assert store.writes == 2
