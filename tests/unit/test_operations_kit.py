"""The chart's Grafana dashboard has the shape Grafana reads (docs/operations.md names the
version); its metric names against a running operator, and the alert rules under promtool, are
tests/cluster/test_operations_kit.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operations_kit import (
    GRAFANA_VERSION,
    REPO,
    RULES_TEMPLATE,
    SCHEMA_VERSION,
    dashboard,
    dashboard_queries,
    metric_names,
    panels,
    rule_expressions,
)

BOARD = dashboard()
# Panel types built into Grafana 11 that the dashboard uses.
PANEL_TYPES = {"row", "timeseries", "stat", "table", "gauge", "bargauge"}


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    assert BOARD["schemaVersion"] == SCHEMA_VERSION
    assert BOARD["uid"] == "kube-ddp" and BOARD["title"]
    assert "id" not in BOARD  # Grafana assigns it: a fixed id clashes on import
    assert isinstance(BOARD["time"]["from"], str) and isinstance(BOARD["refresh"], str)


def test_every_panel_has_its_place_type_and_queries() -> None:
    ids = [p["id"] for p in panels(BOARD)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(BOARD):
        where = panel["title"]
        assert panel["type"] in PANEL_TYPES, where
        grid = panel["gridPos"]
        assert {k: type(v) for k, v in grid.items()} == dict.fromkeys("hwxy", int), where
        assert grid["x"] + grid["w"] <= 24, f"{where} is wider than Grafana's 24 columns"
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{where} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        assert all(t["expr"].strip() for t in panel["targets"]), where


def test_panels_do_not_overlap() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in panels(BOARD):
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[x, y]}"
                taken[x, y] = panel["title"]


def test_every_query_uses_the_datasource_variable() -> None:
    variables = {v["name"]: v for v in BOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    sources: list[Any] = [p["datasource"] for p in panels(BOARD) if p["type"] != "row"]
    sources += [t["datasource"] for p in panels(BOARD) for t in p.get("targets", [])]
    assert all(s == {"type": "prometheus", "uid": "${datasource}"} for s in sources)


@pytest.mark.parametrize(
    "wanted",
    [
        "kubeddp_jobs",  # jobs by phase
        "kubeddp_group_restarts_total",  # restarts and their reasons
        "kubeddp_time_to_running_seconds_bucket",
        "kubeddp_reconcile_errors_total",
        "kubeddp_reconcile_duration_seconds_bucket",
        "kubeddp_leader",
        "kubeddp_job_epoch",  # per job: progress, images/s, ETA
        "kubeddp_job_images_per_second",
    ],
)
def test_the_dashboard_shows(wanted: str) -> None:
    assert wanted in metric_names(dashboard_queries(BOARD))


def test_the_rules_alert_on_leader_errors_restarts_and_stalls() -> None:
    used = metric_names(rule_expressions(RULES_TEMPLATE.read_text()))
    assert used == {
        "kubeddp_leader",
        "kubeddp_reconcile_errors_total",
        "kubeddp_job_restarts",
        "kubeddp_job_progress_timestamp_seconds",
    }


def test_the_docs_name_the_grafana_version_of_the_schema() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    assert f"**Grafana {GRAFANA_VERSION}** (dashboard `schemaVersion` {SCHEMA_VERSION})" in text
