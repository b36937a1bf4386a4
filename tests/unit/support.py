"""Shared helpers of the unit tier: jobs built from plain dicts, as a job file holds them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate

from kube_ddp.api import DDPTrainingJob, load_job
from kube_ddp.expansion import container_argv, resolve_env

REPO = Path(__file__).resolve().parents[2]
# Every example job (kueue/ holds the queues, not a job).
EXAMPLES = sorted(
    path
    for path in (REPO / "manifests" / "examples").rglob("*.yaml")
    if path.parent.name != "kueue"
)


def load_hack_script(name: str) -> ModuleType:
    """hack/<name>.py as a module (hack/ is no package), loaded once per session."""
    module_name = f"kube_ddp_hack_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, REPO / "hack" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


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


def kubelet_argv(container: dict[str, Any]) -> list[str]:
    """What the container's process is started with: its command and args after the kubelet's
    `$(NAME)` expansion against its env (kube_ddp/expansion.py); a `valueFrom` reads empty."""
    env = resolve_env(container.get("env", []), lambda name, source: "")
    return container_argv(container, env)
