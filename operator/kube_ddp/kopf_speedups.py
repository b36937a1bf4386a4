"""Two costs of kopf's own that the operator benchmark found, removed from outside kopf.

- Watch events are decoded by orjson: kopf's API module reads only `json.loads` of `json`
  (each watch line); decoding pods' watch stream with the standard library was the largest
  single cost in a py-spy profile of 1,000 jobs starting, and orjson takes about 40% of its time.
- kopf's index readiness (`aiotoggles.ToggleSet`) wakes every waiter on each change of its
  set: at startup each listed pod adds and then drops a toggle, while every object already
  listed waits for the set to be on, so a restart with N live jobs did O(N^2) wake-ups (py-spy:
  most of a 1,000-job re-sync). A waiter only cares whether the set's state flips: the
  replacements below notify only then, which no waiter can tell apart except by its speed.

`apply()` is called from the operator's startup handler, before the first watch. A test pins
the kopf version these were written against (tests/unit/test_kopf_speedups.py): an upgrade
must look again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import kopf._cogs.clients.api as kopf_api
import orjson
from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet


class OrjsonCodec:
    """What kopf's API module reads of `json`, answered by orjson."""

    loads = staticmethod(orjson.loads)


async def _change(toggles: ToggleSet, change: Callable[[], object]) -> None:
    """`change` the set's members; wake its waiters only if that flipped the set's state."""
    async with toggles._condition:
        was = toggles.is_on()
        change()
        if toggles.is_on() != was:
            toggles._condition.notify_all()


async def _make_toggle(self: ToggleSet, __val: bool = False, *, name: str | None = None) -> Toggle:
    toggle = Toggle(__val, name=name, condition=self._condition)
    await _change(self, lambda: self._toggles.add(toggle))
    return toggle


async def _drop_toggle(self: ToggleSet, toggle: Toggle) -> None:
    await _change(self, lambda: self._toggles.discard(toggle))


async def _drop_toggles(self: ToggleSet, toggles: Iterable[Toggle]) -> None:
    await _change(self, lambda: self._toggles.difference_update(toggles))


def apply() -> None:
    kopf_api.json = OrjsonCodec  # type: ignore[attr-defined,assignment]
    ToggleSet.make_toggle = _make_toggle  # type: ignore[method-assign]
    ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    ToggleSet.drop_toggles = _drop_toggles  # type: ignore[method-assign]
