"""Prometheus metrics of the operator, served on /metrics of their own port."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kube_ddp.api import JobStatus

RECONCILE_ERRORS = Counter(
    "kubeddp_reconcile_errors", "Reconciles that failed (each is retried with a growing delay)"
)
JOBS_SYNCED = Counter(
    "kubeddp_jobs_synced",
    "Jobs reconciled since the operator started, each counted once (a job created again, once "
    "more): after a restart it reaches the number of live jobs once the operator caught up",
)
LEADER = Gauge("kubeddp_leader", "1 when this operator process is the active leader, else 0")
GROUP_RESTARTS = Counter("kubeddp_group_restarts", "Group restarts of DDPTrainingJobs")
TIME_TO_RUNNING = Histogram(
    "kubeddp_time_to_running_seconds",
    "From a job's creation to all of its workers running (first attempt)",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)


class JobsByPhase(Collector):
    """kubeddp_jobs{phase}: computed at scrape time from the operator's view of its jobs."""

    def __init__(self, statuses: Callable[[], Iterable[dict[str, Any]]]) -> None:
        self._statuses = statuses

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("kubeddp_jobs", "DDPTrainingJobs by phase", labels=["phase"])
        tally = Tally((status or {}).get("phase") or "New" for status in self._statuses())
        for phase, count in sorted(tally.items()):
            family.add_metric([phase], count)
        yield family


def serve(port: int, statuses: Callable[[], Iterable[dict[str, Any]]]) -> None:
    """Start the /metrics endpoint (a daemon thread); port 0 turns it off."""
    if port:
        REGISTRY.register(JobsByPhase(statuses))
        start_http_server(port)


def _created_at(body: dict[str, Any]) -> datetime | None:
    stamp = body.get("metadata", {}).get("creationTimestamp")
    if not stamp:
        return None
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def observe_transition(body: dict[str, Any], before: JobStatus, after: JobStatus) -> None:
    """Count what a status write changed."""
    if after.restarts > before.restarts:
        GROUP_RESTARTS.inc(after.restarts - before.restarts)
    if after.phase == "Running" and before.phase != "Running" and after.restarts == 0:
        created = _created_at(body)
        if created is not None:
            TIME_TO_RUNNING.observe((datetime.now(UTC) - created).total_seconds())
