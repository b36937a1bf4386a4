"""Naming the rank that stopped first, from each rank's last entry in the group's store."""

from __future__ import annotations

import dataclasses
import threading
import time

from ddp_trainer.culprit import Entry, Ledger, describe, slowest

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


def test_a_job_of_one_rank_is_named_alone_with_no_peer_or_network_blamed() -> None:
    said = describe([entry(0, None, 1, step=26)], 1, NOW, interval=5)
    assert said.startswith("rank 0 (pod job-worker-0, node node-0) stopped, at step 26: ")
    assert "the job's only rank, in its own code" in said
    assert "network" not in said and "silent" not in said
    assert "silent for 30 s" in describe([entry(0, None, 30, step=26)], 1, NOW, interval=5)


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


class DictStore:
    """The store calls the ledger makes, on a dict (the real store is in the Gaudi-path and
    launcher tests)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return self.data[key].encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)


def test_rank_0_tells_which_rank_the_group_waits_on_once_per_stall() -> None:
    """Rank 0's ledger thread, not blocked where the main thread is: no step for an interval,
    so it reads every entry and tells whom the group waits on, or that all are even; nothing
    while steps are made, once per finding, and again in the next stall."""
    store, clock, told = DictStore(), [NOW], []
    ledger = Ledger(store, lambda: 120, 0, 5, "job-worker-0", "node-0", clock=lambda: clock[0])
    ledger.watch(3, told.append)
    store.set("kubeddp/progress/1", entry(1, 120, 0).encode())
    store.set("kubeddp/progress/2", entry(2, 120, 0).encode())
    ledger.write()
    assert ledger.check_group() is None and told == []  # it just stepped
    clock[0] += 6
    ledger.check_group()
    assert told == [
        {
            "rank": None,
            "pod": None,
            "node": None,
            "step": None,
            "message": "no rank fell behind: all 3 were at 120 collective(s) and were heard "
            "from within 10 s (the network, not a rank?)",
        }
    ]  # even: a long validation, say
    store.set("kubeddp/progress/2", entry(2, 118, -6).encode())
    ledger.check_group()
    ledger.check_group()
    assert len(told) == 2
    assert (told[1]["rank"], told[1]["pod"], told[1]["node"]) == (2, "job-worker-2", "node-2")
    assert told[1]["message"].startswith("rank 2 (pod job-worker-2, node node-2) stopped first")
    ledger.step += 1  # the group moves on: no stall, nothing read
    clock[0] += 6
    assert ledger.check_group() is None
    ledger.check_stall()  # the thread notes the step, as each interval
    clock[0] += 6
    assert ledger.check_group() is not None and len(told) == 3


def timed(rank: int, compute_ms: float | None) -> Entry:
    return dataclasses.replace(entry(rank, 120, 0), compute_ms=compute_ms)


def test_the_slowest_rank_is_measured_against_the_median_of_the_others() -> None:
    found = slowest([timed(0, 10.0), timed(1, 31.0), timed(2, 12.0), timed(3, 9.0)])
    assert found is not None
    assert (found[0].rank, round(found[1], 2)) == (1, 3.1)  # 31 ms against 10 ms
    assert slowest([timed(0, 10.0), timed(1, None)]) is None  # one rank timed: no comparison


def test_a_straggler_is_said_after_two_checks_and_cleared_after_two() -> None:
    """Rank 0's thread, every half interval: a rank 1.5x the others' median twice in a row
    is said once; its recovery twice in a row clears it (None); a single slow check is not."""
    store, told = DictStore(), []
    ledger = Ledger(store, lambda: 120, 0, 5, "job-worker-0", "node-0", clock=lambda: NOW)
    ledger.watch(3, lambda fields: None, told.append)
    ledger.timed(0.010)
    ledger.write()

    def others(rank_1_ms: float) -> None:
        store.set("kubeddp/progress/1", timed(1, rank_1_ms).encode())
        store.set("kubeddp/progress/2", timed(2, 11.0).encode())

    for rank_1_ms, expected in [(30.0, []), (11.0, []), (30.0, []), (30.0, [1])]:
        others(rank_1_ms)
        ledger.check_stragglers()
        assert [t["rank"] for t in told if t] == expected
    assert told[0]["slowerBy"] == round(30.0 / 10.5, 2)
    assert told[0]["message"].startswith("rank 1 (pod job-worker-1, node node-1) takes 2.9x ")
    others(30.0)
    ledger.check_stragglers()
    assert len(told) == 1  # said once
    others(10.0)
    ledger.check_stragglers()
    others(10.0)
    ledger.check_stragglers()
    assert told[1:] == [None]
