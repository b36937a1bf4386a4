"""What kopf watches, from its `Insights`: the one place kube-ddp imports a private kopf module.

kopf==1.45.2 takes an `Insights` in `kopf.operator(insights=...)` and fills it (the resources it
watches, and a flag once its watches are up) but does not export the type; `serving` creates
one for its readiness probe and `handlers` asks it which optional kinds are served.
"""

from __future__ import annotations

from collections.abc import Callable

from kopf._cogs.structs.references import Insights

__all__ = ["Insights", "watches"]


def watches(insights: Insights, group: str, plural: str) -> Callable[[], bool]:
    """Whether kopf watches the kind: it looks the kinds up once, when it starts."""
    return lambda: any(r.group == group and r.plural == plural for r in insights.watched_resources)
