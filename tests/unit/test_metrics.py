"""The operator's per-job metrics and restart reasons (operator/kube_ddp/metrics.py), as a scrape
reads them; the names against a running operator: tests/cluster/test_operations_kit.py."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from kube_ddp import metrics
from kube_ddp.api import Failure, JobStatus, Preemption


def job(name: str, phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name}, "status": {"phase": phase, **status}}


def scrape(bodies: list[dict[str, Any]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(metrics.JobProgress(lambda: bodies))
    return registry


def test_a_running_job_reports_its_progress() -> None:
    training = {
        "epoch": 3,
        "epochs": 10,
        "imagesPerSec": 812.5,
        "updatedAt": "2026-01-01T00:00:10Z",
    }
    registry = scrape([job("vit", "Running", restarts=2, training=training)])
    labels = {"job_namespace": "team-a", "job_name": "vit"}
    assert registry.get_sample_value("kubeddp_job_restarts", labels) == 2
    assert registry.get_sample_value("kubeddp_job_epoch", labels) == 3
    assert registry.get_sample_value("kubeddp_job_epochs", labels) == 10
    assert registry.get_sample_value("kubeddp_job_images_per_second", labels) == 812.5
    stamp = registry.get_sample_value("kubeddp_job_progress_timestamp_seconds", labels)
    assert stamp == 1767225610.0


def test_a_job_that_is_not_running_has_no_progress_series() -> None:
    training = {"epoch": 10, "epochs": 10, "updatedAt": "2026-01-01T00:00:10Z"}
    registry = scrape([job("done", "Succeeded", restarts=1, training=training), job("new", "")])
    done = {"job_namespace": "team-a", "job_name": "done"}
    assert registry.get_sample_value("kubeddp_job_restarts", done) == 1
    assert registry.get_sample_value("kubeddp_job_epoch", done) is None
    assert registry.get_sample_value("kubeddp_job_progress_timestamp_seconds", done) is None
    new = {"job_namespace": "team-a", "job_name": "new"}
    assert registry.get_sample_value("kubeddp_job_restarts", new) == 0


def test_a_restart_is_counted_under_the_reason_of_its_failure() -> None:
    def count(reason: str) -> float:
        value = REGISTRY.get_sample_value("kubeddp_group_restarts_total", {"reason": reason})
        return value or 0.0

    before = {reason: count(reason) for reason in ("OOMKilled", "Unknown")}
    body = job("vit", "Restarting")
    oom = Failure(pod="vit-worker-1", exit_code=137, reason="OOMKilled")
    metrics.observe_transition(body, JobStatus(restarts=0), JobStatus(restarts=1, failure=oom))
    metrics.observe_transition(body, JobStatus(restarts=1), JobStatus(restarts=2))
    assert count("OOMKilled") == before["OOMKilled"] + 1
    assert count("Unknown") == before["Unknown"] + 1


def test_restarts_are_counted_by_kind() -> None:
    def count(kind: str) -> float:
        labels = {"kind": kind, "reason": "Error"}
        return REGISTRY.get_sample_value("kubeddp_restarts_total", labels) or 0.0

    kinds = ("Group", "InPlace", "Replaced")
    before = {kind: count(kind) for kind in kinds}
    body, failed = job("vit", "Running"), Failure(pod="vit-worker-1", exit_code=137, reason="Error")
    start = JobStatus(restarts=1, attempt=1)
    group = JobStatus(restarts=2, attempt=2, failure=failed)
    in_place = JobStatus(restarts=3, attempt=1, in_place_restarts=2, failure=failed)
    replaced = JobStatus(restarts=2, attempt=1, failure=failed)
    for after in (group, in_place, replaced):
        metrics.observe_transition(body, start, after)
    assert {kind: count(kind) - before[kind] for kind in kinds} == {
        "Group": 1,
        "InPlace": 2,
        "Replaced": 1,
    }


def test_a_preemption_is_counted_by_what_stopped_the_group() -> None:
    def count() -> float:
        labels = {"reason": "EvictionByEvictionAPI"}
        return REGISTRY.get_sample_value("kubeddp_preemptions_total", labels) or 0.0

    before = count()
    drained = Preemption(reason="EvictionByEvictionAPI")
    after = JobStatus(preemptions=3, last_preemption=drained)
    metrics.observe_transition(job("vit", "Restarting"), JobStatus(preemptions=2), after)
    assert count() == before + 1
    registry = scrape([job("vit", "Restarting", preemptions=3)])
    labels = {"job_namespace": "team-a", "job_name": "vit"}
    assert registry.get_sample_value("kubeddp_job_preemptions", labels) == 3


def test_a_time_in_lower_case_is_read() -> None:
    training = {"updatedAt": "2026-01-01t00:00:10z"}
    registry = scrape([job("vit", "Running", training=training)])
    labels = {"job_namespace": "team-a", "job_name": "vit"}
    assert registry.get_sample_value("kubeddp_job_progress_timestamp_seconds", labels) == (
        1767225610.0
    )


def test_one_jobs_bad_values_cost_that_jobs_series_only() -> None:
    """The status is a pod's to write: a scrape never fails for one job's values, and that
    job's series are left out whole (none half-written)."""
    bad = [
        {"updatedAt": "not a time"},
        {"epoch": "three"},
        {"imagesPerSec": float("inf")},
    ]
    bodies = [job(f"bad-{i}", "Running", restarts=1, training=t) for i, t in enumerate(bad)]
    registry = scrape(
        [*bodies, job("good", "Running", restarts=4), job("x", "Running", restarts={})]
    )
    assert (
        registry.get_sample_value(
            "kubeddp_job_restarts", {"job_namespace": "team-a", "job_name": "good"}
        )
        == 4
    )
    for i in range(len(bad)):
        labels = {"job_namespace": "team-a", "job_name": f"bad-{i}"}
        assert registry.get_sample_value("kubeddp_job_restarts", labels) is None


def test_jobs_by_phase_survive_a_phase_that_is_not_a_word() -> None:
    registry = CollectorRegistry()
    bodies = [job("a", "Running"), job("b", ["Running"]), {"status": "x"}]  # type: ignore[arg-type]
    registry.register(metrics.JobsByPhase(lambda: bodies))
    assert registry.get_sample_value("kubeddp_jobs", {"phase": "Running"}) == 1
