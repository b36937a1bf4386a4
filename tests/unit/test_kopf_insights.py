"""kube_ddp/kopf_insights.py against the kopf it is written for: the private names it calls are
kopf 1.45.2's, with the arguments it passes (a kopf upgrade fails here first)."""

from __future__ import annotations

import importlib.metadata
import inspect

from kopf._cogs.clients.scanning import scan_resources
from kopf._core.reactor import observation
from kopf._core.reactor.observation import revise_resources


def test_the_private_kopf_it_calls_is_kopf_1_45_2s() -> None:
    assert importlib.metadata.version("kopf") == "1.45.2"
    assert set(inspect.signature(scan_resources).parameters) == {"settings", "logger", "groups"}
    revise = set(inspect.signature(revise_resources).parameters)
    assert revise == {"group", "insights", "registry", "resources"}
    # what kopf itself does on a CRD event, which rediscover repeats
    source = inspect.getsource(observation.process_discovered_resource_event)
    for step in (
        "scan_resources(groups={group}",
        "revise_resources(",
        "backbone.fill(",
        "notify_all()",
    ):
        assert step in source, step
