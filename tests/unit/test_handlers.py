"""The kopf wiring's one reach into kopf's insides: its watch events decoded by orjson."""

from __future__ import annotations

import inspect
import re

import kopf._cogs.clients.api as kopf_api
import orjson
import pytest

from kube_ddp.handlers import decode_watch_events_with_orjson


def test_kopf_reads_nothing_of_json_but_loads() -> None:
    """Were a kopf upgrade to call another `json` function there, the codec would miss it."""
    used = set(re.findall(r"\bjson\.(\w+)", inspect.getsource(kopf_api)))
    assert used == {"loads"}


def test_watch_events_are_decoded_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf_api, "json", kopf_api.json)  # restored after the test
    decode_watch_events_with_orjson()
    assert kopf_api.json.loads is orjson.loads
    line = b'{"type": "ADDED", "object": {"metadata": {"name": "w\\u00e9"}}}'
    assert kopf_api.json.loads(line.decode("utf-8"))["object"]["metadata"]["name"] == "wé"
