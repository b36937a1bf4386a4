"""The chart's operations kit as its tests read it: the Grafana dashboard's and the alert rules'
PromQL, and the metric names in it (tests/unit and tests/cluster test_operations_kit.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "charts" / "kube-ddp" / "files" / "dashboard.json"
RULES_TEMPLATE = REPO / "charts" / "kube-ddp" / "templates" / "prometheusrule.yaml"
# The Grafana version docs/operations.md names, and the dashboard schema version it writes.
GRAFANA_VERSION = "11.0"
SCHEMA_VERSION = 39
OUR_METRIC = re.compile(r"\bkubeddp_[a-z0-9_]+\b")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its own


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    queries = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            queries.append(query["query"])
    return queries


def rule_expressions(text: str) -> list[str]:
    """The `expr:` of every rule in a rules file or the PrometheusRule template."""
    return re.findall(r"^\s*expr: (.+)$", text, re.MULTILINE)


def metric_names(queries: list[str]) -> set[str]:
    return {name for query in queries for name in OUR_METRIC.findall(query)}


def exported_series(exposition: str) -> set[str]:
    """Every series name a /metrics page offers, also for families with no sample yet (a
    labelled counter before its first increment): from its `# TYPE` lines."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if kind == "histogram":
                names.update(name + suffix for suffix in HISTOGRAM_SERIES)
            else:
                names.add(name)
    return names
