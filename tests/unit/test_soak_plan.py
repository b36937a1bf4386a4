"""The soak's faults come from its seed alone (tests/cluster/soak.py): the same seed replays the
same faults, and the short form meets every kind."""

from __future__ import annotations

import itertools

from tests.cluster.soak import (
    CLUSTER_FAULTS,
    JOB_FAULTS,
    PREEMPTION,
    QUEUED_EVERY,
    Generation,
    Hit,
    Settings,
    Soak,
    plan,
    preemption_reaches,
)
from tests.e2e.soak_node import KINDS as NODE_KINDS
from tests.e2e.soak_node import node_plan

SHORT = Settings(seed=7, minutes=3, jobs=10, nodes=3, faults_per_minute=10)


def test_a_seed_replays_its_faults() -> None:
    assert plan(SHORT) == plan(SHORT)
    assert plan(SHORT) != plan(Settings(**{**SHORT.__dict__, "seed": 8}))


def test_the_short_form_meets_every_kind_and_some_overlaps() -> None:
    for seed in range(200):
        few = Settings(seed=seed, minutes=3, jobs=10, nodes=3, faults_per_minute=2)
        assert {fault.kind for fault in plan(few)} == set(JOB_FAULTS) | set(CLUSTER_FAULTS)
    faults = plan(SHORT)
    assert all(0 < fault.at < SHORT.minutes * 60 for fault in faults)
    job_faults = [fault for fault in faults if fault.kind in JOB_FAULTS]
    close = [
        (a, b)
        for a, b in itertools.combinations(job_faults, 2)
        if a.job == b.job and abs(b.at - a.at) <= 4
    ]
    assert close, "no two faults on one job at once"


def test_a_preemption_reaches_a_queued_job_only() -> None:
    # Kueue preempts only the jobs it admitted: those of every QUEUED_EVERYth slot.
    for seed in range(50):
        faults = plan(Settings(seed=seed, minutes=30, jobs=60, nodes=7, faults_per_minute=60))
        preemptions = [fault.job for fault in faults if fault.kind == "preempt"]
        assert preemptions
        assert all(job % QUEUED_EVERY == 0 and 0 <= job < 60 for job in preemptions)


def test_the_real_node_soak_replays_its_seed_and_meets_every_kind_in_15_minutes() -> None:
    assert node_plan(5, 15, 3) == node_plan(5, 15, 3) != node_plan(6, 15, 3)
    for seed in range(100):
        faults = node_plan(seed, 15, 3)
        assert {fault.kind for fault in faults} == set(NODE_KINDS)
        assert all(60 < fault.at < 15 * 60 and 0 <= fault.slot < 3 for fault in faults)
    seconds = [
        (a, b)
        for a, b in itertools.pairwise(node_plan(5, 15, 3))
        if a.slot == b.slot and b.at - a.at <= 4
    ]
    assert seconds, "no second fault on one job"


def test_a_fault_as_the_operator_goes_away_is_not_counted_as_isolated() -> None:
    """soak-014 of seed 323023: a suspend 13 s into an API server restart was acted on (its pods
    deleted) by a leader that could not write why, and the next leader read the pods as lost.
    Such a fault meets another (the outage); one well after the outage is alone."""
    soak = Soak.__new__(Soak)  # the count model alone, no cluster
    soak.operator_away = [100.0]

    def hit(at: float) -> Hit:
        return Hit(at, "suspend", "suspend (Running)", 1, True, PREEMPTION, "Running", 0, 0, 0)

    during, after = hit(113.0), hit(300.0)
    generation = Generation("soak-014", "uid", {"nodes": 2}, work=60.0, created=0.0)
    generation.hits = [during, after]
    generation.outcome = {"at": 600.0}
    assert soak._isolated(generation) == [after]


def test_a_preemption_may_reach_a_queued_job_until_it_ends() -> None:
    """soak-016 and soak-028 of seed 323023: preemptors made while the job was suspended (by the
    user, about to resume; by an earlier preemption) preempted it once Kueue readmitted it
    before the preemptor's Workload was queued."""
    assert preemption_reaches("Running")
    assert preemption_reaches("Suspended")
    assert not preemption_reaches("Succeeded")
    assert not preemption_reaches("Failed")
