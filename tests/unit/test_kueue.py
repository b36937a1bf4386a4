"""Kueue's contract for external kinds (kube_ddp.kueue): the Workload, reading an admission,
`plan` as a table, and the shell carrying it out against a fake API server."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pytest

from kube_ddp import kueue, names
from kube_ddp.api import DDPTrainingJob, JobStatus, load_job
from kube_ddp.builders import BuildSettings, job_labels
from kube_ddp.controller import Controller
from kube_ddp.kube import request_url, workload_path
from kube_ddp.launchers import build_children, kueue_pods
from kube_ddp.launchers.mpi import LAUNCHER_REQUESTS
from kube_ddp.reasons import Reason
from kube_ddp.status import decide
from kube_ddp.status.views import MPIJobView
from tests.unit.fake_api import FakeApi
from tests.unit.support import job_document
from tests.unit.test_controller import KEY, UID, job_body, run, start, written_statuses

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
GAUDI = {"nodes": 2, "accelerator": {"type": "gaudi", "perNode": 8}}


def queued_job(
    spec: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
) -> DDPTrainingJob:
    document = job_document(spec or {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}})
    document["metadata"] |= {"uid": UID, "labels": {kueue.QUEUE_LABEL: "lq", **(labels or {})}}
    if status:
        document["status"] = status
    return load_job(document)


def workload_for(job: DDPTrainingJob, priority: int | None = None) -> dict[str, Any]:
    pods = kueue_pods(job, BuildSettings())
    workload = kueue.build_workload(job, pods, job_labels(job), priority)
    workload["metadata"]["resourceVersion"] = "7"
    return workload


def condition(type_: str, status: str, reason: str = "R", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def with_status(workload: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {**copy.deepcopy(workload), "status": status}


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {"name": "worker", "count": 2, "flavors": {"cpu": "nvidia", "nvidia.com/gpu": "nvidia"}}
    ],
}
NVIDIA_FLAVOR = {
    "spec": {
        "nodeLabels": {"kubeddp.io/accelerator": "nvidia"},
        "tolerations": [
            {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
        ],
    }
}


# --- the Workload -------------------------------------------------------------------------


def test_workload_describes_the_pod_set_with_accelerator_and_hugepages() -> None:
    job = queued_job(GAUDI, labels={kueue.PRIORITY_CLASS_LABEL: "production"})
    workload = workload_for(job, priority=1000)
    assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert workload["metadata"]["name"] == kueue.workload_name(job)
    assert workload["metadata"]["name"].startswith("ddptrainingjob-bar-")
    assert workload["metadata"]["labels"][kueue.JOB_UID_LABEL] == UID
    spec = workload["spec"]
    assert spec["queueName"] == "lq"
    assert spec["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "production",
    }
    assert spec["priority"] == 1000
    (pod_set,) = spec["podSets"]
    assert (pod_set["name"], pod_set["count"]) == ("worker", 2)
    requests = pod_set["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"habana.ai/gaudi": 8, "hugepages-2Mi": "95000Mi", "memory": "32Gi"}
    assert "hostname" not in pod_set["template"]["spec"]


def test_workload_name_changes_with_the_job_uid() -> None:
    job = queued_job()
    other = job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": "uid-2"})})
    assert kueue.workload_name(job) != kueue.workload_name(other)


def test_admitted_template_is_the_users_plus_the_flavors() -> None:
    job = queued_job(
        {
            "nodes": 2,
            "template": {
                "nodeSelector": {"zone": "a"},
                "tolerations": [{"key": "x", "operator": "Exists"}],
            },
        }
    )
    workload = with_status(workload_for(job), admission=ADMISSION)
    wanted = kueue.admitted_template(workload, {"nvidia": NVIDIA_FLAVOR})
    assert wanted == {
        "nodeSelector": {"zone": "a", "kubeddp.io/accelerator": "nvidia"},
        "tolerations": [
            {"key": "x", "operator": "Exists"},
            *NVIDIA_FLAVOR["spec"]["tolerations"],
        ],
    }


def test_admission_check_updates_are_merged() -> None:
    job = queued_job()
    checks = [{"name": "prov", "podSetUpdates": [{"name": "worker", "nodeSelector": {"r": "1"}}]}]
    workload = with_status(workload_for(job), admission=ADMISSION, admissionChecks=checks)
    wanted = kueue.admitted_template(workload, {"nvidia": {"spec": {}}})
    assert wanted["nodeSelector"] == {"r": "1"}


# --- plan ---------------------------------------------------------------------------------

ADMITTED = [condition("QuotaReserved", "True"), condition("Admitted", "True")]


def test_unlabelled_job_is_left_alone() -> None:
    job = load_job(job_document({"nodes": 2}))
    assert kueue.plan(job, None, {}, False, NOW) == kueue.Step()


def test_a_new_queued_job_is_suspended_and_gets_a_workload() -> None:
    step = kueue.plan(queued_job(), None, {}, False, NOW)
    assert step.create_workload
    assert step.job_patch == {"spec": {"runPolicy": {"suspend": True}}}
    assert step.suspended is not None
    assert step.suspended[0] == Reason.QUEUED
    assert step.suspended[1].startswith("Queued in LocalQueue lq")


def test_pending_workload_keeps_the_job_suspended_with_kueues_words() -> None:
    job = queued_job(spec={"nodes": 2, "runPolicy": {"suspend": True}})
    pending = condition("QuotaReserved", "False", "Pending", "insufficient unused quota")
    step = kueue.plan(job, with_status(workload_for(job), conditions=[pending]), {}, False, NOW)
    assert step.job_patch is None and not step.create_workload
    assert step.suspended == (Reason.QUEUED, "Queued in LocalQueue lq: insufficient unused quota")


def test_a_running_job_whose_workload_is_not_admitted_is_suspended() -> None:
    job = queued_job()
    step = kueue.plan(job, with_status(workload_for(job), conditions=[]), {}, True, NOW)
    assert step.job_patch == {"spec": {"runPolicy": {"suspend": True}}}


def test_admission_unsuspends_with_the_flavors_selectors() -> None:
    job = queued_job(
        spec={
            "nodes": 2,
            "runPolicy": {"suspend": True},
            "template": {"nodeSelector": {"old": "x"}},
        }
    )
    workload = workload_for(job)
    # The Workload kept the template from before any admission: {"old": "x"} was the user's.
    workload["metadata"]["annotations"][kueue.TEMPLATE_ANNOTATION] = json.dumps(
        {"nodeSelector": {}, "tolerations": []}
    )
    admitted = with_status(workload, admission=ADMISSION, conditions=ADMITTED)
    step = kueue.plan(job, admitted, {"nvidia": NVIDIA_FLAVOR}, False, NOW)
    assert step.job_patch == {
        "spec": {
            "runPolicy": {"suspend": False},
            "template": {
                # a former admission's key goes, this one's comes
                "nodeSelector": {"old": None, "kubeddp.io/accelerator": "nvidia"},
                "tolerations": NVIDIA_FLAVOR["spec"]["tolerations"],
            },
        }
    }
    assert step.suspended is None


def test_an_admitted_starting_job_is_left_alone() -> None:
    job = queued_job(status={"phase": "Starting"})
    admitted = with_status(workload_for(job), admission=ADMISSION, conditions=ADMITTED)
    assert kueue.plan(job, admitted, {}, True, NOW) == kueue.Step()


def test_a_running_job_says_its_pods_are_ready_once() -> None:
    job = queued_job(status={"phase": "Running"})
    admitted = with_status(workload_for(job), admission=ADMISSION, conditions=ADMITTED)
    step = kueue.plan(job, admitted, {}, True, NOW)
    assert step.workload_status is not None and step.job_patch is None
    ready = {c["type"]: c for c in step.workload_status["status"]["conditions"]}["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("True", "Started")
    done = with_status(admitted, conditions=step.workload_status["status"]["conditions"])
    assert kueue.plan(job, done, {}, True, NOW) == kueue.Step()


@pytest.mark.parametrize(
    ("why", "reason", "requeued"),
    [
        ("Preempted", Reason.PREEMPTED, "True"),
        ("NodeFailures", Reason.EVICTED, "True"),
        ("Deactivated", Reason.EVICTED, "False"),
    ],
)
def test_eviction_suspends_then_gives_the_quota_back(why: str, reason: str, requeued: str) -> None:
    job = queued_job()
    evicted = condition("Evicted", "True", why, "for a higher priority workload")
    workload = with_status(workload_for(job), admission=ADMISSION, conditions=[*ADMITTED, evicted])
    first = kueue.plan(job, workload, {}, True, NOW)
    assert first.job_patch == {"spec": {"runPolicy": {"suspend": True}}}
    assert first.workload_status is None  # its pods still run
    assert first.suspended == (
        reason,
        f"Kueue evicted the Workload ({why}): for a higher priority workload",
    )

    suspended = queued_job(spec={"nodes": 2, "runPolicy": {"suspend": True}})
    still_running = kueue.plan(suspended, workload, {}, True, NOW)
    assert still_running.workload_status is None
    released = kueue.plan(suspended, workload, {}, False, NOW).workload_status
    assert released is not None
    assert released["metadata"] == {"resourceVersion": "7"}  # a 409 if Kueue wrote meanwhile
    assert released["status"]["admission"] is None
    after = {c["type"]: (c["status"], c["reason"]) for c in released["status"]["conditions"]}
    assert after == {
        "QuotaReserved": ("False", "Pending"),
        "Admitted": ("False", "NoReservation"),
        "Evicted": ("True", why),
        "Requeued": (requeued, why),
    }


def test_an_ended_job_finishes_its_workload_once() -> None:
    job = queued_job(status={"phase": "Succeeded"})
    workload = with_status(workload_for(job), admission=ADMISSION, conditions=ADMITTED)
    step = kueue.plan(job, workload, {}, False, NOW)
    assert step.workload_status is not None
    finished = [c for c in step.workload_status["status"]["conditions"] if c["type"] == "Finished"]
    assert [(c["status"], c["reason"]) for c in finished] == [("True", "Succeeded")]
    done = with_status(workload, conditions=step.workload_status["status"]["conditions"])
    assert kueue.plan(job, done, {}, False, NOW) == kueue.Step()


def test_a_queue_suspension_is_the_jobs_suspended_condition() -> None:
    job = queued_job(spec={"nodes": 2, "runPolicy": {"suspend": True}})
    decision = decide(job, [], NOW, suspended_by=(Reason.QUEUED, "Queued in LocalQueue lq: x"))
    assert decision.status.phase == "Suspended"
    (suspended,) = [c for c in decision.status.conditions if c.type == "Suspended"]
    assert (suspended.reason, suspended.message) == (Reason.QUEUED, "Queued in LocalQueue lq: x")
    assert decision.actions == ()


# --- the shell ----------------------------------------------------------------------------


def queued_body(**spec: Any) -> dict[str, Any]:
    body = job_body(**spec)
    body["metadata"]["labels"] = {kueue.QUEUE_LABEL: "lq"}
    return body


def test_shell_suspends_a_new_queued_job_and_creates_its_workload() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, queued_body())
        await controller.reconcile(KEY)

    fake = run(scenario)
    (patch,) = [c for c in fake.made("PATCH") if not c.path.endswith("/status")]
    assert patch.body == {"spec": {"runPolicy": {"suspend": True}}}
    (created,) = fake.made("POST", "/workloads")
    owner = created.body["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("DDPTrainingJob", UID, True)
    assert not fake.made("POST", "/pods")  # suspended before any pod exists
    (written,) = written_statuses(fake)
    assert written["phase"] == "Suspended"
    assert written["conditions"][0]["reason"] == Reason.QUEUED


def reconcile_admitted(body: dict[str, Any]) -> FakeApi:
    """One reconcile of the suspended job `body` whose Workload Kueue admitted (ADMISSION)."""
    job = load_job(body)
    workload = with_status(workload_for(job), admission=ADMISSION, conditions=ADMITTED)
    fake = FakeApi()
    fake.objects[workload_path("ns1", kueue.workload_name(job))] = workload
    fake.objects[kueue.flavor_path("nvidia")] = NVIDIA_FLAVOR

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, body)
        await controller.reconcile(KEY)

    return run(scenario, fake)


def test_shell_applies_an_admission_and_starts_the_workers() -> None:
    fake = reconcile_admitted(queued_body(runPolicy={"suspend": True}))
    pods = [c.body for c in fake.made("POST", "/pods")]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeSelector"] == {"kubeddp.io/accelerator": "nvidia"}
        assert NVIDIA_FLAVOR["spec"]["tolerations"][0] in pod["spec"]["tolerations"]
    assert JobStatus.model_validate(written_statuses(fake)[-1]).phase == "Pending"


def test_shell_queues_an_mpi_job_with_a_launcher_and_a_worker_pod_set() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, queued_body(launcher="mpi"))
        await controller.reconcile(KEY)

    fake = run(scenario)
    (created,) = fake.made("POST", "/workloads")
    assert [(p["name"], p["count"]) for p in created.body["spec"]["podSets"]] == [
        ("launcher", 1),
        ("worker", 2),
    ]
    (patch,) = [c for c in fake.made("PATCH") if not c.path.endswith("/status")]
    assert patch.body == {"spec": {"runPolicy": {"suspend": True}}}
    (written,) = written_statuses(fake)
    assert written["phase"] == "Suspended"
    suspended = {c["type"]: c for c in written["conditions"]}["Suspended"]
    assert suspended["reason"] == Reason.QUEUED
    # created suspended, as for any suspended job: the MPI Operator starts no pod of it
    (mpijob,) = fake.made("POST", "/mpijobs")
    assert mpijob.body["spec"]["runPolicy"]["suspend"] is True


def test_shell_holds_a_queued_job_where_kueue_is_not_installed() -> None:
    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, queued_body())
        fake.answer("POST", "/workloads$", 404, "the server could not find the requested resource")
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert not fake.made("POST", "/pods")
    (written,) = written_statuses(fake)
    assert written["phase"] == "Pending"
    assert written["conditions"][-1]["message"] == kueue.NOT_SERVED


def test_priority_class_as_kueue_picks_it() -> None:
    pods_class = {"nodes": 2, "template": {"priorityClassName": "high"}}
    job = queued_job(pods_class)
    ref = kueue.priority_class(job)
    assert ref == {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}
    assert kueue.priority_class_path(ref) == "/apis/scheduling.k8s.io/v1/priorityclasses/high"
    labelled = queued_job(pods_class, labels={kueue.PRIORITY_CLASS_LABEL: "production"})
    ref = kueue.priority_class(labelled)
    assert ref is not None and (ref["kind"], ref["name"]) == ("WorkloadPriorityClass", "production")
    assert kueue.priority_class_path(ref) == (
        "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses/production"
    )
    assert kueue.priority_class(queued_job()) is None


def test_shell_gives_the_workload_its_priority_classs_value() -> None:
    body = queued_body()
    body["metadata"]["labels"][kueue.PRIORITY_CLASS_LABEL] = "production"
    fake = FakeApi()
    path = "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses/production"
    fake.objects[path] = {"kind": "WorkloadPriorityClass", "value": 1000}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, body)
        await controller.reconcile(KEY)

    run(scenario, fake)
    (created,) = fake.made("POST", "/workloads")
    assert created.body["spec"]["priority"] == 1000
    assert created.body["spec"]["priorityClassRef"]["name"] == "production"


def test_shell_holds_a_queued_job_until_workloads_are_watched() -> None:
    """Kueue not there yet (or its CRDs not yet seen by kopf): no admission would reach the
    operator, so the job waits saying what to install, makes no Workload and no pod, and is
    queued as any other once Kueue's kind is watched."""
    watched = [False]

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        controller.watches_workloads = lambda: watched[0]
        start(fake, controller, queued_body())
        await controller.reconcile(KEY)
        assert not fake.made("POST", "/workloads")
        watched[0] = True
        await controller.reconcile(KEY)

    fake = run(scenario)
    assert not fake.made("POST", "/pods")
    first = written_statuses(fake)[0]
    assert first["phase"] == "Pending"
    assert first["conditions"][-1]["message"] == kueue.NOT_SERVED
    assert len(fake.made("POST", "/workloads")) == 1


# --- launcher mpi -------------------------------------------------------------------------

MPI_GPU = {"nodes": 2, "launcher": "mpi", "accelerator": {"type": "nvidia", "perNode": 8}}
CPU_FLAVOR = {"spec": {"nodeLabels": {"kubeddp.io/accelerator": "cpu"}}}
MPI_ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {"name": "launcher", "count": 1, "flavors": {"cpu": "cpu"}},
        *ADMISSION["podSetAssignments"],
    ],
}


def test_mpi_workload_has_the_launchers_and_the_workers_pod_sets() -> None:
    job = queued_job(MPI_GPU)
    launcher, worker = workload_for(job)["spec"]["podSets"]
    assert (launcher["name"], launcher["count"], worker["name"], worker["count"]) == (
        "launcher",
        1,
        "worker",
        2,
    )
    (mpijob,) = [c for c in build_children(job) if c["kind"] == names.MPIJOB_KIND]
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    # each pod set is its MPIJob template: the launcher asks for no GPU, a worker for 8
    assert launcher["template"]["spec"] == replicas["Launcher"]["template"]["spec"]
    assert worker["template"]["spec"] == replicas["Worker"]["template"]["spec"]
    requests = worker["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == 8
    launcher_requests = launcher["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert launcher_requests == LAUNCHER_REQUESTS


def test_mpi_admission_places_each_pod_set_by_its_own_flavor() -> None:
    job = queued_job({**MPI_GPU, "runPolicy": {"suspend": True}})
    workload = with_status(workload_for(job), admission=MPI_ADMISSION, conditions=ADMITTED)
    flavors = {"nvidia": NVIDIA_FLAVOR, "cpu": CPU_FLAVOR}
    assert kueue.all_assigned_flavors(workload) == ["cpu", "nvidia"]
    step = kueue.plan(job, workload, flavors, False, NOW)
    assert step.job_patch is not None
    assert step.job_patch["spec"]["template"]["nodeSelector"] == {
        "kubeddp.io/accelerator": "nvidia"
    }
    placement = step.job_patch["metadata"]["annotations"][names.LAUNCHER_PLACEMENT_ANNOTATION]
    assert json.loads(placement) == {
        "nodeSelector": {"kubeddp.io/accelerator": "cpu"},
        "tolerations": [],
    }
    # the job as the patch leaves it: each MPIJob template with its own pod set's flavor
    document = job_document(MPI_GPU)
    document["metadata"]["annotations"] = {names.LAUNCHER_PLACEMENT_ANNOTATION: placement}
    document["spec"]["template"] = {
        "nodeSelector": {"kubeddp.io/accelerator": "nvidia"},
        "tolerations": NVIDIA_FLAVOR["spec"]["tolerations"],
    }
    (mpijob,) = [c for c in build_children(load_job(document)) if c["kind"] == names.MPIJOB_KIND]
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    launcher, worker = (replicas[r]["template"]["spec"] for r in ("Launcher", "Worker"))
    assert launcher["nodeSelector"] == {"kubeddp.io/accelerator": "cpu"}
    assert "tolerations" not in launcher
    assert worker["nodeSelector"] == {"kubeddp.io/accelerator": "nvidia"}
    assert NVIDIA_FLAVOR["spec"]["tolerations"][0] in worker["tolerations"]


def test_mpi_readmission_replaces_the_former_flavors_on_the_mpijob() -> None:
    # Evicted from flavor a (its selectors still on the job), readmitted to flavor b: the
    # suspended MPIJob resumes with b's, in both templates.
    body = queued_body(
        launcher="mpi", runPolicy={"suspend": True}, template={"nodeSelector": {"pool": "a"}}
    )
    former = json.dumps({"nodeSelector": {"pool": "a"}, "tolerations": []})
    body["metadata"]["annotations"] = {names.LAUNCHER_PLACEMENT_ANNOTATION: former}
    body["status"] = {"phase": "Suspended"}
    job = load_job(body)
    workload = workload_for(job)
    workload["metadata"]["annotations"][kueue.TEMPLATE_ANNOTATION] = json.dumps({})
    admission = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": "launcher", "count": 1, "flavors": {"cpu": "b"}},
            {"name": "worker", "count": 2, "flavors": {"cpu": "b"}},
        ],
    }
    fake = FakeApi()
    fake.objects[workload_path("ns1", kueue.workload_name(job))] = with_status(
        workload, admission=admission, conditions=ADMITTED
    )
    fake.objects[kueue.flavor_path("b")] = {"spec": {"nodeLabels": {"pool": "b"}}}

    async def scenario(fake: FakeApi, controller: Controller) -> None:
        start(fake, controller, body)
        controller.mpijobs[KEY] = MPIJobView(name="bar", attempt=0, suspended=True, owner_uid=UID)
        await controller.reconcile(KEY)

    run(scenario, fake)
    (resume,) = fake.made("PATCH", "/mpijobs/")
    ops = {op["path"]: op["value"] for op in resume.body}
    assert ops["/spec/runPolicy/suspend"] is False
    for replica in ("Launcher", "Worker"):
        path = f"/spec/mpiReplicaSpecs/{replica}/template/spec/nodeSelector"
        assert ops[path] == {"pool": "b"}  # a's key gone


@pytest.mark.parametrize("name", ["..", ".", "../../api/v1/secrets", "a/b", "x?y#z"])
def test_a_name_is_one_path_segment_whatever_it_holds(name: str) -> None:
    """Names reach request paths escaped: none climbs out of its collection, and the URL the
    client sends keeps the escape rather than resolving it."""
    path = kueue.priority_class_path({"group": "scheduling.k8s.io", "name": name})
    prefix = "/apis/scheduling.k8s.io/v1/priorityclasses/"
    segment = path.removeprefix(prefix)
    assert path.startswith(prefix) and "/" not in segment and segment not in (".", "..")
    assert unquote(segment) == name
    assert request_url("https://api:6443", path).raw_path == path
