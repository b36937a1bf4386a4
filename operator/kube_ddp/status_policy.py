"""The ValidatingAdmissionPolicy that keeps the job status the operator's: a status write by any
account but the operator's may change only what the pods report (`status.training`,
`status.rankRestart`). It closes the window `status/trust.py` leaves (an operator that has
just started has no record of what it wrote), in the API server, at no request's cost.

The chart installs it (hack/chart.py writes the template from `policy` and `binding`) where
the API server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (1.30+).
"""

from __future__ import annotations

from typing import Any, Final

from kube_ddp import names
from kube_ddp.api import JobStatus
from kube_ddp.status.trust import REPORTED

API_VERSION: Final = "admissionregistration.k8s.io/v1"


def owned_keys() -> list[str]:
    """The status keys the operator owns, as the API server holds them (camelCase)."""
    return [
        field.alias or name
        for name, field in JobStatus.model_fields.items()
        if name not in REPORTED
    ]


def validations() -> list[dict[str, str]]:
    """One rule per owned key: unchanged by this write (absent before and after, or equal)."""
    reported = " and ".join(
        f"status.{JobStatus.model_fields[name].alias}" for name in sorted(REPORTED)
    )
    return [
        {
            "expression": f"object.?status.?{key} == oldObject.?status.?{key}",
            "message": (
                f"status.{key} is written by the kube-ddp operator only; pods may report {reported}"
            ),
            "reason": "Forbidden",
        }
        for key in owned_keys()
    ] + [
        {
            # a rank 0 of an earlier attempt (its node cut off, its ranks still running)
            "expression": "!object.?status.?training.?attempt.hasValue() || "
            "object.status.training.attempt == oldObject.?status.?attempt.orValue(0)",
            "message": "status.training.attempt is not the job's current attempt: a report "
            "of an earlier group is not taken",
            "reason": "Forbidden",
        }
    ]


def operator_only_policy(
    name: str,
    operator_user: str,
    rule: dict[str, Any],
    validations: list[dict[str, str]],
    conditions: tuple[dict[str, str], ...] = (),
) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy on the writes `rule` matches by anyone but `operator_user`
    (the operator's username: `system:serviceaccount:<namespace>:<account>` in the cluster),
    failing closed, for those that also meet `conditions`."""
    exempt = {
        "name": "not-the-operator",
        "expression": f"request.userInfo.username != {cel_string(operator_user)}",
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "matchConditions": [exempt, *conditions],
            "validations": validations,
        },
    }


def policy(name: str, operator_user: str) -> dict[str, Any]:
    """The policy, for status writes of DDPTrainingJobs by anyone but `operator_user`."""
    rule = {
        "apiGroups": [names.GROUP],
        "apiVersions": ["*"],
        "operations": ["UPDATE"],
        "resources": [f"{names.PLURAL}/status"],
    }
    return operator_only_policy(name, operator_user, rule, validations())


def binding(name: str, namespace: str | None = None) -> dict[str, Any]:
    """The binding that puts policy `name` to work, in every namespace or in `namespace`."""
    spec: dict[str, Any] = {"policyName": name, "validationActions": ["Deny"]}
    if namespace is not None:
        selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        spec["matchResources"] = {"namespaceSelector": selector}
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": spec,
    }


def cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
