"""The soak's faults come from its seed alone (tests/cluster/soak.py): the same seed replays the
same faults, and the short form meets every kind."""

from __future__ import annotations

import itertools

from tests.cluster.soak import CLUSTER_FAULTS, JOB_FAULTS, QUEUED_EVERY, Settings, plan
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
