"""The status policy's rules (kube_ddp/status_policy.py), against the models: every field the
operator owns is guarded, the pods' reports are not; and the pod policy's (kube_ddp/pod_policy.py).
tests/cluster/test_status_policy.py and test_pod_policy.py run them on the real API server."""

from __future__ import annotations

from kube_ddp import names, pod_policy, status_policy
from kube_ddp.api import JobStatus


def test_every_status_field_but_the_reports_is_guarded() -> None:
    keys = status_policy.owned_keys()
    every = {field.alias for field in JobStatus.model_fields.values()}
    assert set(keys) == every - {"training", "rankRestart"}
    expressions = [v["expression"] for v in status_policy.validations()]
    assert "object.?status.?phase == oldObject.?status.?phase" in expressions
    assert len(expressions) == len(keys) + 1  # and one for the report's attempt
    assert any("status.training.attempt" in e for e in expressions)


def test_only_the_operators_user_is_exempt() -> None:
    policy = status_policy.policy("p", "system:serviceaccount:kube-ddp:it's")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        "request.userInfo.username != 'system:serviceaccount:kube-ddp:it\\'s'"
    )
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["ddptrainingjobs/status"], ["UPDATE"])
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_a_binding_may_hold_for_one_namespace() -> None:
    assert "matchResources" not in status_policy.binding("p")["spec"]
    scoped = status_policy.binding("p", "team-a")["spec"]["matchResources"]
    assert scoped == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}
    }


def test_only_the_operator_makes_or_relabels_a_pod_labelled_as_a_worker() -> None:
    policy = pod_policy.policy("p", "system:serviceaccount:kube-ddp:op")
    exempt, labelled = policy["spec"]["matchConditions"]
    assert (
        exempt["expression"] == "request.userInfo.username != 'system:serviceaccount:kube-ddp:op'"
    )
    assert f"'{names.LABEL_MANAGED_BY}'" in labelled["expression"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # pods/status, pods/binding and pods/eviction (the kubelet, the scheduler, a drain) are not
    # matched: only the pod itself
    assert (rule["resources"], rule["operations"]) == (["pods"], ["CREATE", "UPDATE"])
    (validation,) = policy["spec"]["validations"]
    assert validation["message"] == pod_policy.MESSAGE
