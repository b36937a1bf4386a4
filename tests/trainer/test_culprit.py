"""Naming the rank that stopped first, from each rank's last entry in the group's store."""

from __future__ import annotations

from ddp_trainer.culprit import Entry, describe

NOW = 1000.0


def entry(rank: int, collectives: int, age: float, step: int = 40) -> Entry:
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
