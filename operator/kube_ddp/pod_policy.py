"""The ValidatingAdmissionPolicy that keeps a torchrun job's workers the operator's own: a pod
labelled `app.kubernetes.io/managed-by: kube-ddp` is selected by its job's headless Service
(the workers' DNS names, the rendezvous' among them) and admitted by its NetworkPolicy, so only
the operator's account may create one, give a pod that label, or change the labels of a pod
that has it. Labels then are proof: no other pod can take a worker's DNS name or reach the
rendezvous as a peer. The operator checks each pod's controlling owner all the same
(`status.views`), where the policy is not installed.

The chart installs it beside the status policy (hack/chart.py writes the template from
`policy`, and `status_policy.binding` binds it).
"""

from __future__ import annotations

from typing import Any

from kube_ddp import names
from kube_ddp.status_policy import cel_string, operator_only_policy

MESSAGE = (
    f"pods labelled {names.LABEL_MANAGED_BY}={names.MANAGED_BY} are the kube-ddp operator's "
    "workers: only its account creates them or changes their labels"
)


def _labelled(object_: str) -> str:
    label = cel_string(names.LABEL_MANAGED_BY)
    return f"{object_}.metadata.?labels[?{label}].orValue('') == {cel_string(names.MANAGED_BY)}"


def policy(name: str, operator_user: str) -> dict[str, Any]:
    """The policy, for pod writes by anyone but `operator_user`. A pod write that leaves the
    labels as they were (the garbage collector's, a kubelet's annotation) passes."""
    rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["pods"],
    }
    labelled = {
        "name": "labelled-as-a-worker",
        "expression": f"{_labelled('object')} || (oldObject != null && {_labelled('oldObject')})",
    }
    unchanged = {
        "expression": "oldObject != null && object.metadata.?labels == oldObject.metadata.?labels",
        "message": MESSAGE,
        "reason": "Forbidden",
    }
    return operator_only_policy(name, operator_user, rule, [unchanged], (labelled,))
