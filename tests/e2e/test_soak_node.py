"""The soak on the real node (tests/e2e/soak_node.py): `make soak-node` runs it, 15 minutes
(SOAK_MINUTES) of real trainer jobs, SOAK_JOBS (3) at once, from a new seed or SOAK_SEED. Not
part of `make test`: the kwok soak's short form is (tests/cluster/test_soak.py)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tests.cluster.operator_support import Jobs
from tests.e2e.conftest import OPERATOR_NAMESPACE
from tests.e2e.platform import Platform
from tests.e2e.soak_node import NodeSoak

SOAK_NODE = "SOAK_NODE"  # set by `make soak-node`


@pytest.mark.skipif(
    not os.environ.get(SOAK_NODE), reason="the real-node soak runs with `make soak-node` (15 min)"
)
def test_real_jobs_at_random_faults_lose_nothing(platform: Platform, jobs: Jobs) -> None:
    seed = int(os.environ.get("SOAK_SEED") or random.SystemRandom().randrange(10**6))
    minutes = float(os.environ.get("SOAK_MINUTES") or 15)
    at_once = int(os.environ.get("SOAK_JOBS") or 3)
    print(f"real-node soak seed {seed}: SOAK_SEED={seed} replays these faults")
    soak = NodeSoak(platform, jobs, OPERATOR_NAMESPACE, seed=seed, minutes=minutes, at_once=at_once)
    try:
        soak.run()
    finally:
        results = soak.results()
        print(json.dumps(results, indent=1))
        if path := os.environ.get("SOAK_RESULTS"):
            Path(path).write_text(json.dumps(results, indent=1) + "\n")
    stories = [f"{v.at:.0f}s {v.job}: {v.what}\n{soak.history(v.job)}" for v in soak.violations]
    assert not soak.violations, f"seed {seed}\n" + "\n\n".join(stories)[-20000:]
