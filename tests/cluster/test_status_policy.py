"""The status policy (kube_ddp/status_policy.py) on the real API server: a worker's own token
may report progress and nothing else, whether or not an operator is there to restore what it
would forge; the operator's account writes the rest."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from kube_ddp import names
from tests.cluster.operator_support import (
    Jobs,
    OperatorProcess,
    admission_policy_in,
    job_manifest,
    service_account_token,
)
from tests.cluster.support import Cluster, wait_for
from tests.cluster.test_lifecycle import epoch_3_report


@pytest.fixture
def policy(cluster: Cluster, namespace: str) -> Iterator[str]:
    with admission_policy_in(cluster, namespace) as name:
        yield name


def patch_status(api: Any, jobs: Jobs, name: str, status: dict[str, Any]) -> None:
    api.patch_namespaced_custom_object_status(
        names.GROUP, names.VERSION, jobs.namespace, names.PLURAL, name, {"status": status}
    )


def refusal(api: Any, jobs: Jobs, name: str, status: dict[str, Any]) -> str | None:
    """The API server's words refusing the write, or None where it took it."""
    try:
        patch_status(api, jobs, name, status)
    except kubernetes.client.ApiException as error:
        assert error.status == 403, error.body
        return str(error.body)
    return None


def test_a_workers_token_may_report_progress_and_nothing_else(
    cluster: Cluster, jobs: Jobs, policy: str, operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("guarded", nodes=2))
    jobs.wait_phase("guarded", "Running")  # the operator's own writes pass
    token = service_account_token(cluster, jobs.namespace, "guarded-trainer")
    worker = kubernetes.client.CustomObjectsApi(cluster.client_with_token(token))
    # a new policy is in force within a second or two of its creation
    said = wait_for(
        lambda: refusal(worker, jobs, "guarded", {"phase": "Succeeded"}),
        "the policy to refuse a forged phase",
    )
    assert "status.phase is written by the kube-ddp operator only" in said
    for forged in ({"replacing": [1]}, {"restarts": 5}, {"attempt": 3}, {"failure": {"pod": "x"}}):
        assert refusal(worker, jobs, "guarded", forged) is not None, forged
    assert refusal(worker, jobs, "guarded", epoch_3_report()["status"]) is None
    # a rank 0 of an earlier attempt, still running where its node was cut off
    training = epoch_3_report()["status"]["training"]
    earlier = refusal(worker, jobs, "guarded", {"training": {**training, "attempt": 1}})
    assert earlier is not None and "not the job's current attempt" in earlier
    assert refusal(worker, jobs, "guarded", {"training": {**training, "attempt": 0}}) is None
    rank_restart = {"attempt": 0, "count": 1, "pod": "guarded-worker-1", "rank": 1}
    assert refusal(worker, jobs, "guarded", {"rankRestart": rank_restart}) is None
    status = jobs.status("guarded")
    assert (status["phase"], status["training"]["epoch"]) == ("Running", 3)
    jobs.end_worker("guarded-worker-0", 0)
    jobs.wait_phase("guarded", "Succeeded")  # and so do the operator's to the end


def test_the_crd_bounds_what_anyone_writes_to_the_status(cluster: Cluster, jobs: Jobs) -> None:
    """Whoever writes it (here the admin, whom no policy stops), the status stays in the CRD's
    bounds: indices of the job's workers, numbers in range, messages of bounded length."""
    jobs.create(job_manifest("bounded", nodes=2))
    admin = kubernetes.client.CustomObjectsApi(cluster.api)
    training = epoch_3_report()["status"]["training"]
    for invalid in (
        {"replacing": [2]},
        {"replacing": [1] * 1025},
        {"restarts": 2**31},
        {"training": {**training, "loss": 1e16}},
        {"training": {**training, "progressPercentage": 101}},
        {"training": {**training, "stall": {"message": "x" * 40000}}},
        {"failure": {"pod": "p" * 254}},
    ):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            patch_status(admin, jobs, "bounded", invalid)
        assert refused.value.status == 422, invalid
    at_the_bounds = {
        "replacing": [1],
        "restarts": 2**31 - 1,
        "observedGeneration": 2**53 - 1,
        "training": {**training, "loss": 1e15, "step": 2**53 - 1},
    }
    patch_status(admin, jobs, "bounded", at_the_bounds)
    status = jobs.status("bounded")
    assert (status["replacing"], status["observedGeneration"]) == ([1], 2**53 - 1)
