"""kube_ddp.kopf_speedups: kopf's watch events decoded by orjson, and its index readiness
waking its waiters only when the readiness changes."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import re
from collections.abc import Iterator

import kopf._cogs.clients.api as kopf_api
import orjson
import pytest
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from kube_ddp import kopf_speedups


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """kopf_speedups.apply() for one test; kopf as it was afterwards."""
    monkeypatch.setattr(kopf_api, "json", kopf_api.json)
    for method in ("make_toggle", "drop_toggle", "drop_toggles"):
        monkeypatch.setattr(ToggleSet, method, getattr(ToggleSet, method))
    kopf_speedups.apply()
    yield


def test_written_against_the_pinned_kopf() -> None:
    """The replacements copy kopf 1.45.2's ToggleSet methods but for when they notify: another
    kopf must be read again before this test's version is moved."""
    assert importlib.metadata.version("kopf") == "1.45.2"


def test_kopf_reads_nothing_of_json_but_loads() -> None:
    """Were kopf to call another `json` function there, the codec would not answer it."""
    assert set(re.findall(r"\bjson\.(\w+)", inspect.getsource(kopf_api))) == {"loads"}


def test_watch_events_are_decoded_by_orjson(applied: None) -> None:
    assert kopf_api.json.loads is orjson.loads
    line = b'{"type": "ADDED", "object": {"metadata": {"name": "w\\u00e9"}}}'
    assert kopf_api.json.loads(line.decode("utf-8"))["object"]["metadata"]["name"] == "wé"


def test_readiness_wakes_its_waiters_once_when_every_object_is_indexed(applied: None) -> None:
    """kopf's startup: each listed object adds a toggle and drops it once indexed, while the
    objects already listed wait for the set to be on. Waking them on every drop made a restart
    with N jobs quadratic; now the last drop alone wakes them, and each waiter still returns."""

    async def scenario() -> tuple[int, list[bool]]:
        indexed = ToggleSet(all)
        toggles = [await indexed.make_toggle(name=f"pod-{i}") for i in range(50)]
        notified = 0
        notify_all = indexed._condition.notify_all

        def counting() -> None:
            nonlocal notified
            notified += 1
            notify_all()

        indexed._condition.notify_all = counting  # type: ignore[method-assign]
        waiters = [asyncio.create_task(indexed.wait_for(True)) for _ in range(20)]
        await asyncio.sleep(0)
        for toggle in toggles[:-1]:
            await indexed.drop_toggle(toggle)
        await asyncio.sleep(0)
        still_waiting = [not w.done() for w in waiters]
        await indexed.drop_toggle(toggles[-1])
        await asyncio.wait_for(asyncio.gather(*waiters), timeout=5)
        return notified, still_waiting

    notified, still_waiting = asyncio.run(scenario())
    assert all(still_waiting)
    assert notified == 1


def test_a_set_turning_off_wakes_who_waits_for_off(applied: None) -> None:
    """The other use of ToggleSet (kopf's pause, `any`): waiting for off, woken by a drop."""

    async def scenario() -> bool:
        paused = ToggleSet(any)
        one = await paused.make_toggle(True, name="peering")
        two = await paused.make_toggle(True, name="conflict")
        waiter = asyncio.create_task(paused.wait_for(False))
        await paused.drop_toggles([one])
        await asyncio.sleep(0)
        early = waiter.done()
        await paused.drop_toggle(two)
        await asyncio.wait_for(waiter, timeout=5)
        return early

    assert asyncio.run(scenario()) is False
