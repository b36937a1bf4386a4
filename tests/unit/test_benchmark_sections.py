"""Each section of docs/BENCHMARKS.md is written with its raw results beside it
(benchmarks/markdown.py), and its text says where they are: checked over small made-up
results, since the benchmarks themselves take minutes to hours."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import crd_cost, recovery, shards
from benchmarks.__main__ import BENCHMARKS
from benchmarks.markdown import Section, raw_note, raw_path, write_section
from tests.unit.support import REPO


def test_a_section_is_written_with_its_raw_results_beside_it(tmp_path: Path) -> None:
    document = tmp_path / "docs" / "BENCHMARKS.md"
    raw = {"repeats": 3, "load": [1.5, 2.0], "cells": {"a": [1.0, 2.0]}}
    write_section(document, "shards", Section("## Shards\n\nfirst run", raw))
    write_section(document, "crd", Section("## CRD", {"jobs": 5}))
    write_section(document, "shards", Section("## Shards\n\nsecond run", {**raw, "repeats": 1}))
    text = document.read_text()
    assert "second run" in text and "first run" not in text and "## CRD" in text
    written = raw_path("shards", document)
    assert written == tmp_path / "docs" / "benchmarks-shards.json"
    assert json.loads(written.read_text()) == {**raw, "repeats": 1}
    assert written.read_text() == json.dumps({**raw, "repeats": 1}, indent=1) + "\n"


def test_every_section_keeps_its_raw_results_in_docs() -> None:
    for name in BENCHMARKS:
        assert raw_path(name) == REPO / "docs" / f"benchmarks-{name}.json"
        assert raw_note(name) == f"Raw results: `{raw_path(name).relative_to(REPO)}`."


def test_every_section_writer_says_where_its_raw_results_are() -> None:
    """Each benchmark's module puts its own section's note in the text it writes."""
    for name, module in BENCHMARKS.items():
        source = (REPO / "benchmarks" / f"{module}.py").read_text()
        if name == "operator":
            source = (REPO / "benchmarks" / "operator_report.py").read_text()
        assert f"raw_note({name!r})" in source.replace('"', "'") or (
            "raw_note(SECTION)" in source and f'SECTION = "{name}"' in source
        ), name


def _crd() -> dict[str, Any]:
    batch = {"jobs": 2, "cpu_s": 0.01, "wall_s": 0.5, "latencies_s": [0.01, 0.02]}
    return {
        "jobs": 2,
        "clients": 1,
        "load": [1.0],
        "minutes": 1.0,
        "batches": [{"variant": v, **batch} for v in crd_cost.VARIANTS],
    }


def _shards() -> dict[str, Any]:
    burst = {"jobs": 2, "all_pods_s": 3.0, "cpu_s": 1.0, "rss_mib": 90.0}
    return {
        "jobs": 2,
        "workers": 2,
        "load": [1.0],
        "minutes": 1.0,
        "bursts": [{"layout": layout, **burst} for layout in shards.LAYOUTS],
    }


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("crd", lambda: crd_cost.render(_crd())),
        ("shards", lambda: shards.render(_shards())),
        ("recovery", lambda: recovery.render({"outcomes": [], "load": []})),
    ],
)
def test_a_rendered_section_names_its_raw_file(name: str, text: Any) -> None:
    assert raw_note(name) in text()
