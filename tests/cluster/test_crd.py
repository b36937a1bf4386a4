"""The generated CRD (manifests/crd.yaml) on a real apiserver: schema, strict fields, CEL rules."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes
import pytest
import yaml

from tests.cluster.support import REPO, Cluster, wait_for

EXAMPLE = REPO / "manifests" / "examples" / "mnist-mlp-cpu.yaml"
GROUP, VERSION, PLURAL = "kubeddp.io", "v1alpha1", "ddptrainingjobs"
pytestmark = pytest.mark.usefixtures("crd")  # conftest: manifests/crd.yaml applied, Established


def create_job(cluster: Cluster, namespace: str, job: dict[str, Any]) -> Any:
    """Server-side dry run with strict field validation: nothing is stored, all is checked."""
    return cluster.custom_objects.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, job, dry_run="All", field_validation="Strict"
    )


def rejection(cluster: Cluster, namespace: str, job: dict[str, Any]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as rejected:
        create_job(cluster, namespace, job)
    assert rejected.value.status in (400, 422), rejected.value.body
    return str(rejected.value.body)


@pytest.fixture
def job() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))


def test_kubectl_explains_the_spec(cluster: Cluster) -> None:
    # The OpenAPI the apiserver publishes catches up with a new CRD a moment after it is
    # Established: poll.
    explained = wait_for(
        lambda: cluster.kubectl("explain", "ddptrainingjob.spec", check=False).stdout,
        "kubectl explain ddptrainingjob.spec",
        timeout=30,
        interval=0.5,
    )
    assert "KIND:" in explained and "DDPTrainingJob" in explained
    assert "accelerator" in explained


def test_valid_job_is_accepted(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    created = create_job(cluster, namespace, job)
    assert created["kind"] == "DDPTrainingJob"


def test_unknown_field_is_rejected(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    job["spec"]["nodez"] = 3
    assert 'unknown field \\"spec.nodez\\"' in rejection(cluster, namespace, job)


def test_elastic_bounds_rule(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    job["spec"]["elastic"] = {"minNodes": 3, "maxNodes": 2}
    assert "must not exceed maxNodes" in rejection(cluster, namespace, job)


def test_reserved_env_rule(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    job["spec"]["env"] = [{"name": "RANK", "value": "1"}]
    assert "RANK is reserved" in rejection(cluster, namespace, job)
