"""What kopf watches, from its `Insights`: the one place kube-ddp imports private kopf modules.

kopf==1.45.2 takes an `Insights` in `kopf.operator(insights=...)` and fills it (the resources it
watches, and a flag once its watches are up) but does not export the type; `serving` creates
one for its readiness probe and `handlers` asks it which optional kinds are served.

kopf scans the API's kinds once at its start (kube-ddp runs it with scanning off: following the
CRDs and namespaces needs cluster-wide rights). `rediscoverer` gives the operator the look kopf
takes at one group on a CRD event, for a job that waits for a kind installed later
(tests/unit/test_kopf_insights.py pins what it calls).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from kopf import OperatorRegistry, OperatorSettings
from kopf._cogs.clients.scanning import scan_resources
from kopf._cogs.structs.references import Insights
from kopf._core.reactor.observation import revise_resources

__all__ = ["Insights", "rediscoverer", "watches"]

log = logging.getLogger(__name__)


def watches(insights: Insights, group: str, plural: str) -> Callable[[], bool]:
    """Whether kopf watches the kind now (once its CRD was seen, or a rediscovery found it)."""
    return lambda: any(r.group == group and r.plural == plural for r in insights.watched_resources)


def rediscoverer(
    insights: Insights, settings: OperatorSettings, registry: OperatorRegistry
) -> Callable[[str], Awaitable[None]]:
    """A look at one API group's kinds, as kopf takes on a CRD event: the kinds served are
    matched to the handlers again, and kopf starts (or stops) their watches."""

    async def rediscover(group: str) -> None:
        resources = await scan_resources(groups={group}, settings=settings, logger=log)
        async with insights.revised:
            revise_resources(resources=resources, insights=insights, registry=registry, group=group)
            await insights.backbone.fill(resources=resources)
            insights.revised.notify_all()

    return rediscover
