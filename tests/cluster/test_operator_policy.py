"""The operator's own floor (--pod-security, --allowed-service-account, --fixed-network-policy)
on a real API server whose namespace enforces nothing: a job below it Fails before anything of
it is created, saying which pod and which check; a job that meets it runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.operator_support import (
    Jobs,
    OperatorProcess,
    job_manifest,
    running_operator,
)
from tests.cluster.support import Cluster


@pytest.fixture
def strict_operator(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> Iterator[OperatorProcess]:
    flags = (
        "--pod-security=restricted",
        "--allowed-service-account=etl",
        "--fixed-network-policy",
    )
    with running_operator(cluster, namespace, tmp_path, *flags) as process:
        yield process


def failure(jobs: Jobs, name: str) -> dict[str, str]:
    status = jobs.wait_phase(name, "Failed")
    return next(c for c in status["conditions"] if c["type"] == "Failed")


def test_a_job_below_the_operators_floor_fails_and_one_above_it_runs(
    cluster: Cluster, jobs: Jobs, strict_operator: OperatorProcess
) -> None:
    jobs.create(job_manifest("root", nodes=1, template={"securityContext": {"runAsUser": 0}}))
    jobs.create(job_manifest("other-sa", nodes=1, template={"serviceAccountName": "builder"}))
    wide = {"ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}
    jobs.create(job_manifest("open", nodes=1, networkPolicy=wide))
    jobs.create(job_manifest("fine", nodes=1))
    root = failure(jobs, "root")
    assert root["reason"] == "PodSecurityViolation"
    assert "root-worker-0 does not meet the restricted Pod Security Standard" in root["message"]
    assert "runAsUser=0" in root["message"]
    other = failure(jobs, "other-sa")
    assert other["reason"] == "ForbiddenByOperator"
    assert "names the ServiceAccount builder" in other["message"]
    opened = failure(jobs, "open")
    assert opened["reason"] == "ForbiddenByOperator"
    assert "(--fixed-network-policy)" in opened["message"]
    jobs.wait_phase("fine", "Running")
    # nothing of a refused job was made: no pod, no NetworkPolicy, no account
    for name in ("root", "other-sa", "open"):
        assert not jobs.pods(name)
        made = cluster.kubectl(
            "get", "networkpolicy,serviceaccount", "-n", jobs.namespace, "-o", "name"
        ).stdout
        assert f"/{name}" not in made and f"/{name}-trainer" not in made
