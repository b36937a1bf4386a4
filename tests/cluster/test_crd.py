"""The generated CRD (manifests/crd.yaml) on a real apiserver: schema, strict fields, CEL rules."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes
import pytest
import yaml

from kube_ddp import names
from tests.api_cases import REJECTIONS, Rejection
from tests.cluster.support import REPO, Cluster, wait_for

EXAMPLE = REPO / "manifests" / "examples" / "mnist-mlp-cpu.yaml"
pytestmark = pytest.mark.usefixtures("crd")  # conftest: manifests/crd.yaml applied, Established


def create_job(cluster: Cluster, namespace: str, job: dict[str, Any]) -> Any:
    """Server-side dry run with strict field validation: nothing is stored, all is checked."""
    return cluster.custom_objects.create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        namespace,
        names.PLURAL,
        job,
        dry_run="All",
        field_validation="Strict",
    )


def rejection(cluster: Cluster, namespace: str, job: dict[str, Any]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as rejected:
        create_job(cluster, namespace, job)
    assert rejected.value.status in (400, 422), rejected.value.body
    return str(json.loads(rejected.value.body)["message"])


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


@pytest.mark.parametrize("case", REJECTIONS, ids=[case.id for case in REJECTIONS])
def test_the_server_refuses_what_render_refuses(
    cluster: Cluster, namespace: str, case: Rejection
) -> None:
    """The unit tier's table of invalid specs, sent to the real API server: each is refused,
    every cross-field rule with render's own words (its CEL twin is right)."""
    document = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": "bar", "namespace": namespace},
        "spec": case.spec,
    }
    assert case.server_says in rejection(cluster, namespace, document)
