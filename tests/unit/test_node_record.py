"""The real node belongs to the cluster it joined (its state directory), not to the clone: a
clone's second cluster (`make test`'s lane beside) going down leaves the first's node be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.support import REPO, load_dev_cluster

node = load_dev_cluster().node


@pytest.fixture
def stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(node, "RECORD", tmp_path / "node.json")
    calls: list[str] = []
    monkeypatch.setattr(node, "_stop", lambda record: calls.append(record["cluster"]))
    return calls


def record(tmp_path: Path, **owner: str) -> None:
    (tmp_path / "node.json").write_text(json.dumps({**owner, "components": [], "host": {}}))


def test_another_clusters_node_is_left_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: list[str]
) -> None:
    monkeypatch.setattr(node, "THIS_CLUSTER", str(REPO / ".cluster-beside"))
    record(tmp_path, cluster=str(REPO / ".cluster"))
    assert node._down_locked() is False
    assert stopped == []


def test_this_clusters_node_is_stopped_and_an_older_record_names_the_clones_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: list[str]
) -> None:
    monkeypatch.setattr(node, "THIS_CLUSTER", str(REPO / ".cluster"))
    record(tmp_path, repo=str(REPO))  # written before nodes named their cluster
    assert node._down_locked() is True
    assert stopped == [str(REPO / ".cluster")]
