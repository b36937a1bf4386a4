"""The operator benchmark (`make bench`) runs end to end on a tiny size, with Kubeflow's MPI
Operator, Training Operator and Trainer v2 (with JobSet) built and run beside kube-ddp. No
figure is checked against a goal: speed is for the benchmark, not for tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import crd_cost, operator_measure, operator_report, shards
from benchmarks.contenders import CONTENDERS
from tests.cluster.support import Cluster, load_dev_cluster

# Its peers are built in the background (tests/cluster/conftest.py) while the tier runs.
pytestmark = pytest.mark.last_in_tier


@pytest.mark.timeout(1800)  # the MPI Operator's machine-wide lock may make it wait
def test_operator_benchmark_runs_with_the_peers(cluster: Cluster, tmp_path: Path) -> None:
    sizes = operator_measure.QUICK
    mpioperator = load_dev_cluster().mpioperator
    had_mpijobs = mpioperator.crd_installed(cluster.kubeconfig)
    try:
        results = operator_measure.measure(tmp_path, sizes, list(CONTENDERS.values()))
    finally:
        # Later modules check what a cluster without the MPIJob kind does.
        if not had_mpijobs:
            mpioperator.remove_crd(cluster.kubeconfig)
    for key, contender in CONTENDERS.items():
        assert results["apply2"][key]["n"] == sizes.apply_jobs
        assert results["burst5"][key]["pods"] == 5 * sizes.burst_workers
        if contender.stages == ("apply", "burst"):  # the floor: no controller to go on with
            assert key not in results["completion"] and key not in results["scale"]
            continue
        assert results["completion"][key]["n"] == sizes.completion_jobs
        # Every lifecycle created pods: the scheduler bound them, whoever made them.
        assert results["completion"][key]["requests_per_job"]["POST pods/binding"] >= 2
        restart = results["scale"][key]["restart"]
        assert restart["jobs"] == sizes.scale_jobs[0]
    text = operator_report.render(results, sizes, "pytest")
    for title in results["contenders"].values():
        assert title in text
    assert (tmp_path / "results.json").is_file()
    # Trainer v2 is two controllers: its scale figures are both processes'.
    assert results["scale"]["trainer-v2"]["scale"][0]["rss_mib"] > 0
    # Its webhooks went with it: none is left to refuse a TrainJob, a JobSet or its pods.
    trainer = load_dev_cluster().kubeflow_trainer
    registered = cluster.kubectl(
        "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-o", "name"
    ).stdout
    for name in (*trainer.JOBSET_WEBHOOKS.values(), *trainer.TRAINER_WEBHOOKS.values()):
        assert name not in registered


def test_the_crd_cost_benchmark_runs(cluster: Cluster) -> None:
    """Every CRD variant is installed and takes the demo job, and the report has each."""
    results = crd_cost.measure(1, crd_cost.QUICK_JOBS)
    found = crd_cost.summary(results)
    assert set(found) == set(crd_cost.VARIANTS)
    assert all(row["batches"] == 1 and row["cpu_ms"] >= 0 for row in found.values())
    text = crd_cost.render(results)
    for title in crd_cost.VARIANTS.values():
        assert title in text


def test_the_shards_benchmark_runs(cluster: Cluster) -> None:
    """Both layouts run their burst to the last pod, and the report has each."""
    results = shards.measure(1, shards.QUICK_JOBS)
    found = shards.summary(results)
    assert set(found) == set(shards.LAYOUTS)
    assert all(row["bursts"] == 1 and row["cpu_s"] > 0 for row in found.values())
    text = shards.render(results)
    for title, _ in shards.LAYOUTS.values():
        assert title in text
