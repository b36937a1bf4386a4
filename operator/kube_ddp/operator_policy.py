"""What the operator refuses to create whatever the cluster admits: pods below the level of
`--pod-security` (the Pod Security Standards' checks of `podsecurity.py`, run before the API
server sees the pods), a ServiceAccount `--allowed-service-account` does not name, and under
`--fixed-network-policy` a job that turns its NetworkPolicy off or widens it. Create on
ddptrainingjobs is otherwise create on pods with any account and any pod settings the
namespace's admission lets through (docs/security.md). Pure: a job and its children in, the
reason and message of a refusal out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kube_ddp import podsecurity
from kube_ddp.api import DDPTrainingJob, Obj
from kube_ddp.builders import reporter_account
from kube_ddp.reasons import Reason


@dataclass(frozen=True)
class PodPolicy:
    """The operator's own floor under every job it runs (empty: none)."""

    pod_security: podsecurity.Level | None = None
    # Accounts a job's template.serviceAccountName may name; None: any. The job's own
    # reporting account, which the operator makes, is always allowed.
    service_accounts: tuple[str, ...] | None = None
    fixed_network_policy: bool = False  # a job may not turn its NetworkPolicy off or widen it


def refusal(
    job: DDPTrainingJob, children: Sequence[Obj], policy: PodPolicy
) -> tuple[Reason, str] | None:
    """Why the operator will not create the job's children, or None: PodSecurityViolation
    where a pod falls below --pod-security, else ForbiddenByOperator."""
    own_accounts = [reporter_account(job)]
    problems = []
    pod_security = False
    for pod in podsecurity.rendered_pods(list(children)):
        if policy.pod_security is not None:
            found = podsecurity.violations(pod.metadata, pod.spec, policy.pod_security)
            if found:
                pod_security = True
                problems.append(
                    f"{pod.name} does not meet the {policy.pod_security} Pod Security Standard "
                    f"this operator enforces (--pod-security): {', '.join(map(str, found))}"
                )
        account = pod.spec.get("serviceAccountName")
        allowed = policy.service_accounts
        if allowed is not None and account and account not in (*allowed, *own_accounts):
            listed = ", ".join(allowed) or "none"
            problems.append(
                f"{pod.name} names the ServiceAccount {account}, which this operator does not "
                f"let a job use (--allowed-service-account: {listed}): remove "
                "template.serviceAccountName, or ask the operator's admin to allow it"
            )
    settings = job.spec.network_policy
    widened = settings is not None and (settings.enabled is False or bool(settings.ingress))
    if policy.fixed_network_policy and widened:
        problems.append(
            "spec.networkPolicy turns the job's NetworkPolicy off or widens it, which this "
            "operator does not let a job do (--fixed-network-policy): remove "
            "spec.networkPolicy; the job's own pods reach each other as before"
        )
    if not problems:
        return None
    reason = Reason.POD_SECURITY_VIOLATION if pod_security else Reason.FORBIDDEN_BY_OPERATOR
    return reason, "; ".join(dict.fromkeys(problems))
