"""The chart's operations kit against the real thing: every metric its Grafana dashboard and its
alert rules name is on /metrics of a running operator, and promtool (built from the Prometheus
module, hack/devcluster/build.py) checks the rendered rules and unit-tests each alert with its
own series. The dashboard's shape: tests/unit/test_operations_kit.py."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.helm_support import CHART, Helm
from tests.cluster.operator_support import Jobs, job_manifest, running_operator
from tests.cluster.support import Cluster, load_dev_cluster
from tests.operations_kit import (
    dashboard,
    dashboard_queries,
    exported_series,
    metric_names,
    rule_expressions,
)

KIT = ("--set=operations.prometheusRule.enabled=true", "--set=operations.dashboard.enabled=true")


def rendered_kit(helm: Helm) -> dict[str, dict[str, Any]]:
    out = helm.run("template", "kube-ddp", str(CHART), *KIT).stdout
    return {
        d["kind"]: d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] in {"PrometheusRule", "ConfigMap"}
    }


def test_every_metric_the_kit_names_is_exported(
    cluster: Cluster, namespace: str, jobs: Jobs, helm: Helm, tmp_path: Path
) -> None:
    kit = rendered_kit(helm)
    board = yaml.safe_load(kit["ConfigMap"]["data"]["kube-ddp.json"])
    assert board == dashboard()  # the ConfigMap holds files/dashboard.json as it is
    rules = yaml.safe_dump(kit["PrometheusRule"]["spec"])
    named = metric_names(dashboard_queries(board)) | metric_names(rule_expressions(rules))
    port = load_dev_cluster().free_port()
    with running_operator(cluster, namespace, tmp_path, f"--metrics-port={port}"):
        jobs.create(job_manifest("watched", nodes=2))
        jobs.wait_phase("watched", "Running")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            exposition = response.read().decode()
    missing = named - exported_series(exposition)
    assert not missing, f"the kit names metrics the operator does not export: {sorted(missing)}"
    # the per-job series are there for the running job, labelled so as not to clash with the
    # target's own `namespace` and `job`
    assert (
        f'kubeddp_job_restarts{{job_name="watched",job_namespace="{namespace}"}} 0.0' in exposition
    )


REPORTED = "kubeddp_job_progress_timestamp_seconds"
# Each alert, its own series, when it must fire and when not (promtool's unit-test format).
ALERT_TESTS: list[dict[str, Any]] = [
    {
        "name": "no leader for 5 minutes",
        "interval": "1m",
        "input_series": [{"series": 'kubeddp_leader{pod="a"}', "values": "1 1 0x10"}],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "KubeDDPNoLeader", "exp_alerts": []},
            {
                "eval_time": "9m",
                "alertname": "KubeDDPNoLeader",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical"},
                        "exp_annotations": {
                            "summary": "No kube-ddp operator holds the Lease",
                            "description": (
                                "For 5m no operator process has led (or none was scraped): "
                                "DDPTrainingJobs are neither started, restarted nor finished. "
                                "Look at the operator pods and their logs."
                            ),
                        },
                    }
                ],
            },
        ],
    },
    {
        "name": "reconciles failing for 15 minutes",
        "interval": "1m",
        "input_series": [
            {"series": "kubeddp_leader", "values": "1x40"},
            {"series": "kubeddp_reconcile_errors_total", "values": "0x5 1+1x30"},
        ],
        "alert_rule_test": [
            {"eval_time": "15m", "alertname": "KubeDDPReconcileErrors", "exp_alerts": []},
            {
                "eval_time": "25m",
                "alertname": "KubeDDPReconcileErrors",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning"},
                        "exp_annotations": {
                            "summary": "kube-ddp reconciles keep failing",
                            "description": (
                                "Reconciles of DDPTrainingJobs have failed for 15m (16.67m/s); "
                                "each is retried with a "
                                "growing delay. The operator's log says why."
                            ),
                        },
                    }
                ],
            },
        ],
    },
    {
        "name": "a job restarting three times in an hour",
        "interval": "5m",
        "input_series": [
            {"series": "kubeddp_leader", "values": "1x20"},
            {
                "series": 'kubeddp_job_restarts{job_namespace="team-a",job_name="resnet"}',
                "values": "0 0 1 1 2 2 2 3 3",
            },
            {
                "series": 'kubeddp_job_restarts{job_namespace="team-a",job_name="steady"}',
                "values": "0 0 1 1 1 1 1 1 1",
            },
        ],
        "alert_rule_test": [
            {"eval_time": "30m", "alertname": "KubeDDPJobRestartingRepeatedly", "exp_alerts": []},
            {
                "eval_time": "40m",
                "alertname": "KubeDDPJobRestartingRepeatedly",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "job_namespace": "team-a",
                            "job_name": "resnet",
                        },
                        "exp_annotations": {
                            "summary": "A DDPTrainingJob keeps restarting",
                            "description": "team-a/resnet restarted its worker group 3 times in "
                            "the last hour: `kubectl describe ddpjob` shows the failures.",
                        },
                    }
                ],
            },
        ],
    },
    {
        "name": "a running job that stopped reporting for more than 30 minutes",
        "interval": "5m",
        # reports at 0, 300, 600 s, then none (the gauge keeps its last value)
        "input_series": [
            {"series": "kubeddp_leader", "values": "1x20"},
            {
                "series": REPORTED + '{job_namespace="team-a",job_name="vit"}',
                "values": "0 300 600 600x12",
            },
            {
                "series": REPORTED + '{job_namespace="team-a",job_name="ok"}',
                "values": "0+300x15",
            },
        ],
        "alert_rule_test": [
            {"eval_time": "40m", "alertname": "KubeDDPJobStalled", "exp_alerts": []},
            {
                "eval_time": "45m",
                "alertname": "KubeDDPJobStalled",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "job_namespace": "team-a",
                            "job_name": "vit",
                        },
                        "exp_annotations": {
                            "summary": "A running DDPTrainingJob stopped reporting progress",
                            "description": "The trainer of team-a/vit last reported progress "
                            "35m 0s ago (more than 1800 s), while the job is Running.",
                        },
                    }
                ],
            },
        ],
    },
]


@pytest.fixture(scope="module")
def promtool() -> Path:
    dev_cluster = load_dev_cluster()
    try:
        return Path(dev_cluster.built("promtool"))
    except dev_cluster.BuildError as error:
        pytest.fail(f"promtool did not build: {error}", pytrace=False)


def test_promtool_checks_the_rules_and_each_alert_fires_on_its_series(
    offline_helm: Helm, promtool: Path, tmp_path: Path
) -> None:
    spec = rendered_kit(offline_helm)["PrometheusRule"]["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    alerts = {r["alert"] for g in spec["groups"] for r in g["rules"]}
    assert {t["alert_rule_test"][0]["alertname"] for t in ALERT_TESTS} == alerts
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": ALERT_TESTS}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "tests.yaml"]):
        result = subprocess.run(
            [str(promtool), *args], cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
