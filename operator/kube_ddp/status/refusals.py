"""The API server said no to a child: which refusal it was, and what the job does about it.

The shell hands over the answer's HTTP status and message; `classify` sorts it by the words
Kubernetes' admission plugins write (docs/design.md, "When admission says no" is the table):
a refusal that retrying cannot help fails the job with its own reason, a quota that is full
holds it Pending until there is room, anything else is retried as an error. `refuse` is the
job's side of it: no half group is left holding resources while its peers are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from kube_ddp.api import JobStatus
from kube_ddp.reasons import Reason
from kube_ddp.status.draft import Decision, DeletePods, Draft, Event

# fail: retrying cannot help; wait: it can, once something frees (a quota); retry: a passing
# answer (the server busy, a webhook unreachable), retried with backoff like any error.
Verdict = Literal["fail", "wait", "retry"]

# The admission plugins' own words (k8s.io/apiserver, k8s.io/pod-security-admission,
# plugin/pkg/admission/limitranger, resourcequota).
_WEBHOOK_DENIED = re.compile(r'admission webhook "[^"]+" denied the request')
_POLICY_DENIED = re.compile(r"ValidatingAdmissionPolicy '[^']+' with binding '[^']+' denied")
_POD_SECURITY = "violates PodSecurity"
_QUOTA_EXCEEDED = "exceeded quota"
_LIMIT_RANGE = re.compile(
    r"(maximum|minimum) [\w.-]+ usage per (Container|Pod)|limit to request ratio per"
)
# 403s that are not about the object: the operator's RBAC, a namespace being deleted.
_NOT_ABOUT_THE_OBJECT = re.compile(r"cannot \w+ resource|is being terminated")

POD_SECURITY_FIX = (
    "set the fields it names in spec.template (template.securityContext, "
    "template.container.securityContext), or run the job in a namespace whose "
    "pod-security.kubernetes.io/enforce level allows them"
)
ADMISSION_DENIED_FIX = "change what the message names, or ask the cluster's admin about the rule"
LIMIT_RANGE_FIX = "fit spec.resources (or the template's) into the namespace's LimitRange"
QUOTA_WAIT = (
    "waiting for the namespace's ResourceQuota to have room for every worker (retried with "
    "backoff; no pod is kept meanwhile and no restart is counted)"
)


@dataclass(frozen=True)
class Refusal:
    verdict: Verdict
    reason: Reason | None  # None for verdict retry
    message: str  # one line: the server's words, then what to change


def classify(code: int, message: str) -> Refusal:
    """What the API server's answer (`code`, `message`) to a create means for the job."""
    if _WEBHOOK_DENIED.search(message) or _POLICY_DENIED.search(message):
        return Refusal("fail", Reason.ADMISSION_DENIED, f"{message}: {ADMISSION_DENIED_FIX}")
    if code in (400, 422):
        return Refusal("fail", Reason.INVALID_SPEC, f"Invalid spec: {message}")
    if code != 403 or _NOT_ABOUT_THE_OBJECT.search(message):
        return Refusal("retry", None, message)
    if _POD_SECURITY in message:
        return Refusal("fail", Reason.POD_SECURITY_VIOLATION, f"{message}: {POD_SECURITY_FIX}")
    if _QUOTA_EXCEEDED in message:
        return Refusal("wait", Reason.QUOTA_EXCEEDED, f"{message}: {QUOTA_WAIT}")
    if _LIMIT_RANGE.search(message):
        return Refusal("fail", Reason.LIMIT_RANGE_VIOLATION, f"{message}: {LIMIT_RANGE_FIX}")
    return Refusal("fail", Reason.ADMISSION_REFUSED, message)


_WEIGHT: dict[Verdict, int] = {"fail": 2, "wait": 1, "retry": 0}


def most_decisive(refusals: Iterable[Refusal]) -> Refusal:
    """Of several children refused in one round, the refusal that decides: a failure before a
    wait before a retry (the first of each)."""
    return max(refusals, key=lambda r: _WEIGHT[r.verdict])


def refuse(status: JobStatus, refusal: Refusal, pods: Iterable[str], now: datetime) -> Decision:
    """The job after `refusal` (not a retry) of its children; `pods` are the worker pods that
    exist (created in the refused round or before), deleted so none holds its accelerators
    waiting for peers that cannot come.

    fail: Failed with the refusal's reason. wait: Pending with `Created=False` (the next
    decision creates the group again, `restarts` unchanged) and a Warning Event the first time.
    """
    draft = Draft(status=status, now=now)
    doomed = tuple(sorted(set(pods)))
    if refusal.reason is None or status.phase == "Failed":
        return draft.decision()
    if doomed:
        draft.actions.append(DeletePods(doomed))
    if refusal.verdict == "fail":
        draft.update(completion_time=now)
        draft.condition("Failed", "True", refusal.reason, refusal.message)
        draft.phase("Failed", refusal.reason, refusal.message, warning=True)
        return draft.decision()
    was = next((c for c in status.conditions if c.type == "Created"), None)
    if was is None or (was.status, was.reason) != ("False", refusal.reason):
        draft.events.append(Event("Warning", refusal.reason, refusal.message))
    draft.condition("Created", "False", refusal.reason, refusal.message)
    draft.update(phase="Pending")
    return draft.decision()
