"""The soak's faults come from its seed alone (tests/cluster/soak.py): the same seed replays the
same faults, and the short form meets every kind."""

from __future__ import annotations

import itertools

from tests.cluster.soak import CLUSTER_FAULTS, JOB_FAULTS, Settings, plan

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
