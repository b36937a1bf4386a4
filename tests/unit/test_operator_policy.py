"""operator_policy: the operator's own floor under a job's pods (--pod-security and
--allowed-service-account), decided on the children it is about to create."""

from __future__ import annotations

from typing import Any

from kube_ddp.builders import BuildSettings
from kube_ddp.launchers import build_children
from kube_ddp.operator_policy import PodPolicy, refusal
from tests.unit.support import make_job

SETTINGS = BuildSettings(trainer_image="registry.invalid/trainer:1")
AS_ROOT = {"template": {"securityContext": {"runAsUser": 0}}}
HOST_PATH = {
    "template": {
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        "volumeMounts": [{"name": "host", "mountPath": "/host"}],
    }
}


def refused(policy: PodPolicy, **spec: Any) -> str | None:
    """The message of the operator's refusal, or None."""
    job = make_job(**spec)
    said = refusal(job, build_children(job, settings=SETTINGS), policy)
    if said is None:
        return None
    reason, message = said
    pod_security = "Pod Security Standard this operator enforces" in message
    assert reason == ("PodSecurityViolation" if pod_security else "ForbiddenByOperator")
    return message


def test_no_policy_refuses_nothing() -> None:
    assert refused(PodPolicy(), nodes=2, **HOST_PATH) is None


def test_pods_below_the_level_are_refused_naming_each_pod_and_check() -> None:
    said = refused(PodPolicy(pod_security="restricted"), nodes=2, **AS_ROOT)
    assert said is not None
    assert said.startswith(
        "bar-worker-0 does not meet the restricted Pod Security Standard this operator "
        "enforces (--pod-security): runAsNonRoot != true (pod or container "
    )
    assert "runAsUser=0 (pod must not set runAsUser=0)" in said
    assert "bar-worker-1 does not meet" in said
    assert refused(PodPolicy(pod_security="baseline"), nodes=1, **AS_ROOT) is None
    assert "hostPath volumes" in str(
        refused(PodPolicy(pod_security="baseline"), nodes=1, **HOST_PATH)
    )
    # kube-ddp's own pods meet restricted, an MPI job's launcher and workers too
    assert refused(PodPolicy(pod_security="restricted"), nodes=2) is None
    mpi = {"nodes": 2, "launcher": "mpi", "accelerator": {"type": "nvidia", "perNode": 1}}
    assert refused(PodPolicy(pod_security="restricted"), **mpi) is None


def test_a_service_account_off_the_list_is_refused_the_jobs_own_is_not() -> None:
    policy = PodPolicy(service_accounts=("etl",))
    assert refused(policy, nodes=1) is None  # the job's own reporting account
    assert refused(policy, nodes=1, template={"serviceAccountName": "etl"}) is None
    said = refused(policy, nodes=1, template={"serviceAccountName": "cluster-admin-sa"})
    assert said == (
        "bar-worker-0 names the ServiceAccount cluster-admin-sa, which this operator does not "
        "let a job use (--allowed-service-account: etl): remove template.serviceAccountName, "
        "or ask the operator's admin to allow it"
    )
    none = refused(PodPolicy(service_accounts=()), nodes=1, template={"serviceAccountName": "etl"})
    assert "(--allowed-service-account: none)" in str(none)


def test_a_job_may_not_turn_off_or_widen_its_network_policy_where_it_is_fixed() -> None:
    fixed = PodPolicy(fixed_network_policy=True)
    off = {"enabled": False}
    wide = {"ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}
    assert refused(PodPolicy(), nodes=2, networkPolicy=wide) is None
    assert refused(fixed, nodes=2) is None
    assert refused(fixed, nodes=2, networkPolicy={"enabled": True}) is None
    for settings in (off, wide):
        said = refused(fixed, nodes=2, networkPolicy=settings)
        assert said == (
            "spec.networkPolicy turns the job's NetworkPolicy off or widens it, which this "
            "operator does not let a job do (--fixed-network-policy): remove "
            "spec.networkPolicy; the job's own pods reach each other as before"
        )
