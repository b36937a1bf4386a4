"""`mark_step`, lazy mode's step boundary: here it counts its calls."""

from __future__ import annotations

steps_marked = [0]


def mark_step() -> None:
    steps_marked[0] += 1
