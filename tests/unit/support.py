"""Shared helpers of the unit tier: jobs built from plain dicts, as a job file holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate

from kube_ddp.api import DDPTrainingJob, load_job

REPO = Path(__file__).resolve().parents[2]
# Every example job (kueue/ holds the queues, not a job).
EXAMPLES = sorted(
    path
    for path in (REPO / "manifests" / "examples").rglob("*.yaml")
    if path.parent.name != "kueue"
)
# The Kubernetes version whose schemas the rendered objects are checked against.
KUBERNETES_VERSION = "1.36.0"


def job_document(spec: dict[str, Any], name: str = "bar", namespace: str = "ns1") -> dict[str, Any]:
    return {
        "apiVersion": "kubeddp.io/v1alpha1",
        "kind": "DDPTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def make_job(**spec: Any) -> DDPTrainingJob:
    return load_job(job_document(spec))


def validate_strict(obj: dict[str, Any]) -> None:
    """Fail unless `obj` is valid for the pinned Kubernetes version, unknown fields included."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
