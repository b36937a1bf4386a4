"""The pod policy (kube_ddp/pod_policy.py) on the real API server: an account that may make
pods in the namespace, as a team's member or a job's own code may, cannot make one labelled as a
job's worker, nor label one so, nor relabel a worker; the operator's account makes the workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from kube_ddp import names, pod_policy
from tests.cluster.operator_support import (
    TENANT,
    Jobs,
    OperatorProcess,
    admission_policy_in,
    core_as,
    job_manifest,
    make_tenant,
)
from tests.cluster.support import Cluster, wait_for


@pytest.fixture
def policy(cluster: Cluster, namespace: str) -> Iterator[str]:
    with admission_policy_in(cluster, namespace, pod_policy) as name:
        yield name


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    container = {"name": "trainer", "image": "registry.invalid/impostor"}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [container]}}


def refused(call: Any, *args: Any) -> str | None:
    """The API server's words refusing the call, or None where it took it."""
    try:
        call(*args)
    except kubernetes.client.ApiException as error:
        assert error.status == 403, error.body
        return str(error.body)
    return None


def test_only_the_operator_makes_or_relabels_a_worker(
    cluster: Cluster, jobs: Jobs, namespace: str, policy: str, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("owned", nodes=2))
    jobs.wait_phase("owned", "Running")  # the operator's own pods pass
    make_tenant(cluster, namespace)
    core = core_as(cluster, namespace, TENANT)
    worker_labels = {
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
        names.LABEL_JOB_NAME: "owned",
        names.LABEL_REPLICA_INDEX: "0",
        names.LABEL_ATTEMPT: "0",
    }
    impostor = pod("owned-impostor", worker_labels)
    # a new policy is in force within a second or two of its creation
    said = wait_for(
        lambda: refused(core.create_namespaced_pod, namespace, impostor),
        "the policy to refuse an impostor",
    )
    assert pod_policy.MESSAGE in said
    plain = pod("plain", {"team": "a"})
    assert refused(core.create_namespaced_pod, namespace, plain) is None
    relabel = {"metadata": {"labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY}}}
    assert refused(core.patch_namespaced_pod, "plain", namespace, relabel) is not None
    unlabel = {"metadata": {"labels": {names.LABEL_JOB_NAME: "another"}}}
    assert refused(core.patch_namespaced_pod, "owned-worker-0", namespace, unlabel) is not None
    annotate = {"metadata": {"annotations": {"team.example/note": "read"}}}
    assert refused(core.patch_namespaced_pod, "owned-worker-0", namespace, annotate) is None
    jobs.end_worker("owned-worker-0", 0)
    jobs.wait_phase("owned", "Succeeded")
