"""The tiers run in the order of what they need (tests/background_builds.py)."""

from __future__ import annotations

from tests.background_builds import in_tier_order
from tests.cluster.support import REPO

TESTS = REPO / "tests"


def test_tiers_run_unit_trainer_cluster_e2e_each_in_its_own_order() -> None:
    collected = [
        "cluster/test_b.py",
        "e2e/test_a.py",
        "kind/test_a.py",
        "cluster/test_a.py",
        "trainer/test_b.py",
        "helpers_test.py",
        "unit/test_b.py",
        "trainer/test_a.py",
        "unit/test_a.py",
    ]
    ordered = in_tier_order(collected, lambda name: TESTS / name)
    assert ordered == [
        "unit/test_b.py",
        "unit/test_a.py",
        "trainer/test_b.py",
        "trainer/test_a.py",
        "cluster/test_b.py",
        "cluster/test_a.py",
        "e2e/test_a.py",
        "kind/test_a.py",  # outside the four tiers: after them, in their own order
        "helpers_test.py",
    ]
