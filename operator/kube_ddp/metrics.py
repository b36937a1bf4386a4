"""Prometheus metrics of the operator, served on /metrics of their own port.

The chart's Grafana dashboard and alert rules use these names (docs/operations.md lists them);
a test checks every name they use against a running operator's /metrics. Per-job series are
labelled `job_namespace` and `job_name`: `namespace` and `job` are Prometheus' target labels.
"""

from __future__ import annotations

import logging
import math
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kube_ddp.api import JobStatus

log = logging.getLogger(__name__)

RECONCILE_ERRORS = Counter(
    "kubeddp_reconcile_errors", "Reconciles that failed (each is retried with a growing delay)"
)
JOBS_SYNCED = Counter(
    "kubeddp_jobs_synced",
    "Jobs reconciled since the operator started, each counted once (a job created again, once "
    "more): after a restart it reaches the number of live jobs once the operator caught up",
)
LEADER = Gauge("kubeddp_leader", "1 when this operator process is the active leader, else 0")
GROUP_RESTARTS = Counter(
    "kubeddp_group_restarts",
    "Group restarts of DDPTrainingJobs, by the reason of the failure that caused each",
    ["reason"],
)
RESTARTS = Counter(
    "kubeddp_restarts",
    "Restarts of DDPTrainingJobs (what status.restarts counts), by kind - Group (every pod "
    "recreated, the next attempt), InPlace (a pod's agent restarted its ranks), Replaced (a "
    "lost worker created again alone) - and the reason of the failure that caused each",
    ["kind", "reason"],
)
PREEMPTIONS = Counter(
    "kubeddp_preemptions",
    "Preemptions of DDPTrainingJobs (a group stopped from outside, resumed, no restart counted), "
    "by what stopped it",
    ["reason"],
)
RECONCILE_DURATION = Histogram(
    "kubeddp_reconcile_duration_seconds",
    "Time one reconcile of a job took, failed ones included",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
JOB_LABELS = ["job_namespace", "job_name"]
TIME_TO_RUNNING = Histogram(
    "kubeddp_time_to_running_seconds",
    "From a job's creation to all of its workers running (first attempt)",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)


Bodies = Callable[[], Iterable[dict[str, Any]]]


class JobsByPhase(Collector):
    """kubeddp_jobs{phase}: computed at scrape time from the operator's view of its jobs."""

    def __init__(self, bodies: Bodies) -> None:
        self._bodies = bodies

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("kubeddp_jobs", "DDPTrainingJobs by phase", labels=["phase"])
        tally = Tally(_phase(body) for body in self._bodies())
        for phase, count in sorted(tally.items()):
            family.add_metric([phase], count)
        yield family


# Per job, from its status.training (what the trainer's rank 0 reports after each epoch).
PROGRESS = {
    "epoch": ("kubeddp_job_epoch", "Epochs the job's trainer completed"),
    "epochs": ("kubeddp_job_epochs", "Epochs the job's trainer plans"),
    "imagesPerSec": ("kubeddp_job_images_per_second", "Training throughput of the job, all ranks"),
}


class JobProgress(Collector):
    """Per job: its group restarts and preemptions, and while Running what its trainer last
    reported and when."""

    def __init__(self, bodies: Bodies) -> None:
        self._bodies = bodies

    def collect(self) -> Iterator[GaugeMetricFamily]:
        restarts = GaugeMetricFamily(
            "kubeddp_job_restarts", "Group restarts of the job so far", labels=JOB_LABELS
        )
        preemptions = GaugeMetricFamily(
            "kubeddp_job_preemptions",
            "Times the job's group was preempted and resumed",
            labels=JOB_LABELS,
        )
        reported = GaugeMetricFamily(
            "kubeddp_job_progress_timestamp_seconds",
            "When the running job's trainer last reported progress (Unix time)",
            labels=JOB_LABELS,
        )
        progress = {
            key: GaugeMetricFamily(name, text, labels=JOB_LABELS)
            for key, (name, text) in PROGRESS.items()
        }
        for body in self._bodies():
            try:  # a job's values are a pod's to write: one job's bad ones cost its series only
                samples = list(_job_samples(body, restarts, preemptions, reported, progress))
            except (TypeError, ValueError, OverflowError, AttributeError) as error:
                meta = body.get("metadata") or {}
                log.warning(
                    "metrics: %s/%s skipped: %s", meta.get("namespace"), meta.get("name"), error
                )
                continue
            for family, labels, value in samples:
                family.add_metric(labels, value)
        yield restarts
        yield preemptions
        yield reported
        yield from progress.values()


def serve(port: int, bodies: Bodies) -> None:
    """Start the /metrics endpoint (a daemon thread); port 0 turns it off."""
    if port:
        REGISTRY.register(JobsByPhase(bodies))
        REGISTRY.register(JobProgress(bodies))
        start_http_server(port)


def _phase(body: dict[str, Any]) -> str:
    status = body.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return phase if isinstance(phase, str) and phase else "New"


def _job_samples(
    body: dict[str, Any],
    restarts: GaugeMetricFamily,
    preemptions: GaugeMetricFamily,
    reported: GaugeMetricFamily,
    progress: dict[str, GaugeMetricFamily],
) -> Iterator[tuple[GaugeMetricFamily, list[str], float]]:
    """One job's samples, each a finite number (else the job is skipped whole)."""
    meta, status = body.get("metadata", {}), body.get("status") or {}
    labels = [str(meta.get("namespace", "")), str(meta.get("name", ""))]
    yield restarts, labels, _number(status.get("restarts", 0))
    yield preemptions, labels, _number(status.get("preemptions", 0))
    training = status.get("training") or {}
    if status.get("phase") != "Running":
        return
    for key, family in progress.items():
        if training.get(key) is not None:
            yield family, labels, _number(training[key])
    if stamp := _timestamp(training.get("updatedAt")):
        yield reported, labels, stamp.timestamp()


def _number(value: Any) -> float:
    if isinstance(value, bool) or not math.isfinite(number := float(value)):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def _timestamp(stamp: Any) -> datetime | None:
    """An RFC 3339 time (either case: `z` and `t` are allowed), None if it has no zone."""
    if not stamp:
        return None
    parsed = datetime.fromisoformat(str(stamp).upper().replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else None


def _created_at(body: dict[str, Any]) -> datetime | None:
    return _timestamp(body.get("metadata", {}).get("creationTimestamp"))


def observe_transition(body: dict[str, Any], before: JobStatus, after: JobStatus) -> None:
    """Count what a status write changed."""
    if after.restarts > before.restarts:
        reason = (after.failure.reason if after.failure else None) or "Unknown"
        added = after.restarts - before.restarts
        if after.current_attempt > before.current_attempt:
            GROUP_RESTARTS.labels(reason=reason).inc(added)
            RESTARTS.labels(kind="Group", reason=reason).inc(added)
        elif after.in_place_restarts > before.in_place_restarts:
            RESTARTS.labels(kind="InPlace", reason=reason).inc(added)
        else:
            RESTARTS.labels(kind="Replaced", reason=reason).inc(added)
    if after.preemptions > before.preemptions:
        by = (after.last_preemption.reason if after.last_preemption else None) or "Unknown"
        PREEMPTIONS.labels(reason=by).inc(after.preemptions - before.preemptions)
    if after.phase == "Running" and before.phase != "Running" and after.restarts == 0:
        created = _created_at(body)
        if created is not None:
            TIME_TO_RUNNING.observe((datetime.now(UTC) - created).total_seconds())
