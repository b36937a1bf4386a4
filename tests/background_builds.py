"""The order of the tiers: unit, trainer, cluster, e2e, the order of what they need (the
cluster and e2e tiers build Go binaries on a cold cache; the unit and trainer tiers need none)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

TESTS = Path(__file__).resolve().parent
# What each tier needs, least first: a test outside them runs after them, in its own order.
TIER_ORDER = ("unit", "trainer", "cluster", "e2e")
T = TypeVar("T")


def tier_of(path: Path, tests: Path = TESTS) -> str:
    """tests/<tier>/..., or "" for a path outside tests/."""
    return path.relative_to(tests).parts[0] if path.is_relative_to(tests) else ""


def tier_rank(tier: str) -> int:
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


def in_tier_order(items: Sequence[T], path: Callable[[T], Path], tests: Path = TESTS) -> list[T]:
    """`items` sorted by tier (stable: a tier's tests keep their order)."""
    return sorted(items, key=lambda item: tier_rank(tier_of(path(item), tests)))
