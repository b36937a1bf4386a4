"""What the API server's refusal of a child means for the job (`status.refusals`), as tables.

The messages are the API server's own words, as kube-apiserver v1.36 writes them (PodSecurity,
ResourceQuota, LimitRanger, webhooks, ValidatingAdmissionPolicy, RBAC).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kube_ddp.api import JobStatus
from kube_ddp.reasons import Reason
from kube_ddp.status import DeletePods, Refusal, classify, decide, most_decisive, refuse
from tests.unit.test_status import job

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
POD = 'pods "bar-worker-0" is forbidden: '

CASES = [
    (
        403,
        POD + 'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false',
        "fail",
        Reason.POD_SECURITY_VIOLATION,
    ),
    (
        403,
        POD + "exceeded quota: gpus, requested: requests.cpu=1, used: requests.cpu=1, "
        "limited: requests.cpu=1",
        "wait",
        Reason.QUOTA_EXCEEDED,
    ),
    (403, POD + "maximum cpu usage per Container is 1, but limit is 2", "fail", "LimitRange"),
    (403, POD + "minimum memory usage per Pod is 1Gi, but request is 64Mi", "fail", "LimitRange"),
    (
        403,
        POD + "failed quota: gpus: must specify limits.cpu for: worker",
        "fail",
        Reason.ADMISSION_REFUSED,
    ),
    (
        400,
        'admission webhook "deny.example.com" denied the request: no GPUs on Fridays',
        "fail",
        Reason.ADMISSION_DENIED,
    ),
    (
        403,
        'admission webhook "deny.example.com" denied the request: no GPUs on Fridays',
        "fail",
        Reason.ADMISSION_DENIED,
    ),
    (
        422,
        POD + "ValidatingAdmissionPolicy 'no-host-ipc' with binding 'no-host-ipc' denied "
        "request: hostIPC is not allowed",
        "fail",
        Reason.ADMISSION_DENIED,
    ),
    (422, 'Pod "bar-worker-0" is invalid: spec.volumes[0].name: Required', "fail", "Invalid"),
    (400, "the body of the request was in an unknown format", "fail", Reason.INVALID_SPEC),
    (
        403,
        POD + 'User "system:serviceaccount:kube-ddp:kube-ddp" cannot create resource "pods" '
        'in API group "" in the namespace "ns1"',
        "retry",
        None,
    ),
    (
        403,
        'pods "bar-worker-0" is forbidden: unable to create new content in namespace ns1 '
        "because it is being terminated",
        "retry",
        None,
    ),
    (
        500,
        'Internal error occurred: failed calling webhook "deny.example.com": context deadline '
        "exceeded",
        "retry",
        None,
    ),
    (429, "too many requests", "retry", None),
    (503, "etcdserver: leader changed", "retry", None),
]
SHORT = {"LimitRange": Reason.LIMIT_RANGE_VIOLATION, "Invalid": Reason.INVALID_SPEC}


@pytest.mark.parametrize(("code", "message", "verdict", "reason"), CASES)
def test_the_servers_answer_is_sorted_by_what_retrying_can_do(
    code: int, message: str, verdict: str, reason: str | None
) -> None:
    refusal = classify(code, message)
    assert (refusal.verdict, refusal.reason) == (verdict, SHORT.get(reason or "", reason))
    assert message in refusal.message  # the server's words, quoted whole
    assert "\n" not in refusal.message


def test_a_failure_decides_before_a_wait_before_a_retry() -> None:
    retry = Refusal("retry", None, "busy")
    wait = Refusal("wait", Reason.QUOTA_EXCEEDED, "full")
    fail = Refusal("fail", Reason.POD_SECURITY_VIOLATION, "no")
    assert most_decisive([retry, wait, fail]) == fail
    assert most_decisive([retry, wait]) == wait
    assert most_decisive([retry]) == retry


QUOTA = classify(403, POD + "exceeded quota: gpus, requested: nvidia.com/gpu=8")
SECURITY = classify(403, POD + 'violates PodSecurity "baseline:latest": host namespaces')


def test_a_refusal_that_cannot_pass_fails_the_job_and_deletes_its_pods() -> None:
    decision = refuse(JobStatus(), SECURITY, ["bar-worker-1"], NOW)
    assert decision.status.phase == "Failed"
    (failed,) = [c for c in decision.status.conditions if c.type == "Failed"]
    assert (failed.reason, failed.message) == (SECURITY.reason, SECURITY.message)
    assert decision.actions == (DeletePods(("bar-worker-1",)),)
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", SECURITY.reason)]


def test_a_full_quota_holds_the_job_pending_with_no_pod_and_no_restart() -> None:
    restarting = JobStatus(phase="Restarting", restarts=2)
    decision = refuse(restarting, QUOTA, ["bar-worker-1", "bar-worker-0"], NOW)
    status = decision.status
    assert (status.phase, status.restarts) == ("Pending", 2)
    (created,) = [c for c in status.conditions if c.type == "Created"]
    assert (created.status, created.reason) == ("False", Reason.QUOTA_EXCEEDED)
    assert "ResourceQuota" in created.message and "exceeded quota" in created.message
    assert decision.actions == (DeletePods(("bar-worker-0", "bar-worker-1")),)
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", Reason.QUOTA_EXCEEDED)]
    again = refuse(status, QUOTA, [], NOW)  # the retry refused too: said once, nothing to delete
    assert (again.events, again.actions) == ((), ())


def test_a_job_waiting_for_quota_creates_its_whole_group_again_without_a_restart() -> None:
    waiting = refuse(JobStatus(), QUOTA, ["bar-worker-1"], NOW).status
    document = waiting.model_dump(mode="json", by_alias=True, exclude_none=True)
    decision = decide(job(document), [], NOW)
    assert [a.indices for a in decision.actions] == [(0, 1)]  # type: ignore[union-attr]
    assert decision.status.restarts == 0
    (created,) = [c for c in decision.status.conditions if c.type == "Created"]
    assert (created.status, created.reason) == ("True", Reason.WORKERS_CREATED)
