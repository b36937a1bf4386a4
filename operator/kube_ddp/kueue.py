"""Pure: Kueue's contract for a job kind it does not know, as kube-ddp keeps it for a job
labelled `kueue.x-k8s.io/queue-name`: the Workload a job gets, what an admission or an eviction
means, and `plan`, which decides the step (suspend, admit, evict, finish).

The contract itself, step by step, is docs/design.md ("Queues: Kueue").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from kube_ddp import names
from kube_ddp.api import DDPTrainingJob, Obj
from kube_ddp.reasons import Reason

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
API_VERSION: Final = f"{GROUP}/{VERSION}"
WORKLOAD_KIND: Final = "Workload"
WORKLOADS: Final = "workloads"
RESOURCE_FLAVORS: Final = "resourceflavors"
PRIORITY_CLASSES: Final = "workloadpriorityclasses"
POD_PRIORITY_GROUP: Final = "scheduling.k8s.io"
# The labels Kueue reads on a job (pkg/controller/constants).
QUEUE_LABEL: Final = f"{GROUP}/queue-name"
PRIORITY_CLASS_LABEL: Final = f"{GROUP}/priority-class"
JOB_UID_LABEL: Final = f"{GROUP}/job-uid"
# The value of Kueue's `integrations.externalFrameworks` that names our kind.
EXTERNAL_FRAMEWORK: Final = f"{names.KIND}.{names.VERSION}.{names.GROUP}"
# The pod sets, named as Kueue's own MPIJob integration names them (lower-cased replica types).
POD_SET: Final = "worker"
LAUNCHER_POD_SET: Final = "launcher"
TEMPLATE_ANNOTATION: Final = f"{names.GROUP}/template-before-admission"
# Topology Aware Scheduling (Kueue's TAS, apis/kueue/v1beta2/topology_types.go): a pod set's
# topologyRequest and the annotation naming its level (which also marks the pods as TAS pods,
# so Kueue does not count them a second time as other usage of the nodes); the gate, Workload
# annotation and pod set label by which Kueue's topology ungater finds the pods of an admitted
# pod set, writes each one's domain (topologyAssignment) into its nodeSelector and ungates it.
TOPOLOGY_ANNOTATIONS: Final = {
    "Required": f"{GROUP}/podset-required-topology",
    "Preferred": f"{GROUP}/podset-preferred-topology",
}
# Kueue's mark of a pod set it placed by topology though it asked for none (a flavor with a
# topologyName: implicit TAS); podset.FromAssignment puts it on the job's template.
UNCONSTRAINED_ANNOTATION: Final = f"{GROUP}/podset-unconstrained-topology"
TOPOLOGY_GATE: Final = f"{GROUP}/topology"
WORKLOAD_ANNOTATION: Final = f"{GROUP}/workload"
POD_SET_LABEL: Final = f"{GROUP}/podset"
TOPOLOGY_NOT_QUEUED = (
    f"scheduling.topology needs the label {QUEUE_LABEL}: Kueue's Topology Aware Scheduling "
    "places the workers; label the job with a LocalQueue whose ClusterQueue has a ResourceFlavor "
    "with a topologyName, or remove scheduling.topology"
)
# kopf looks up the kinds it watches once, when it starts (as for MPIJobs).
NOT_SERVED = (
    f"the label {QUEUE_LABEL} needs Kueue, whose Workloads ({API_VERSION}) this cluster does "
    "not serve: the job waits until it does (install Kueue), or remove the label"
)
# Eviction reasons after which Kueue requeues the Workload at once (reconciler.go, step 6).
REQUEUED_AFTER: Final = frozenset({"Preempted", "NodeFailures"})


def queue_name(job: DDPTrainingJob) -> str | None:
    return job.metadata.labels.get(QUEUE_LABEL) or None


def unqueued_refusal(job: DDPTrainingJob) -> str | None:
    """Why a job without the queue label cannot run as written, or None."""
    if queue_name(job) is None and job.spec.topology is not None:
        return TOPOLOGY_NOT_QUEUED
    return None


def topology_request(job: DDPTrainingJob, pod_index_label: str | None) -> Obj | None:
    """A pod set's `topologyRequest` (None without `scheduling.topology`). `pod_index_label`
    numbers the pod set's pods from 0: Kueue then gives consecutive indices neighbouring
    places, so ranks that exchange gradients in a ring sit close together."""
    topology = job.spec.topology
    if topology is None:
        return None
    request: Obj = {topology.mode.lower(): topology.level}
    if pod_index_label is not None:
        request["podIndexLabel"] = pod_index_label
    return request


def _with_metadata(obj: Mapping[str, Any], labels: Obj, annotations: Obj) -> Obj:
    metadata = dict(obj.get("metadata") or {})
    if labels:
        metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    if annotations:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    return {**obj, "metadata": metadata}


def _topology_annotation(job: DDPTrainingJob, pod_set: str) -> Obj:
    """The annotation of the pod set `pod_set`'s topology request: the job's level for the
    workers; the MPI launcher, which carries none of the collectives' traffic, is
    unconstrained (any node of the TAS flavor)."""
    topology = job.spec.topology
    if topology is None:
        return {}
    if pod_set == LAUNCHER_POD_SET:
        return {UNCONSTRAINED_ANNOTATION: "true"}
    return {TOPOLOGY_ANNOTATIONS[topology.mode]: topology.level}


def with_topology(job: DDPTrainingJob, pod_set: Obj, pod_index_label: str | None) -> Obj:
    """A Workload pod set with the job's topology request, on the pod set and as the
    annotation on its template (what Kueue's job framework builds from a job's annotated
    template); unchanged without `scheduling.topology`."""
    request = topology_request(job, pod_index_label)
    if request is None:
        return pod_set
    if pod_set["name"] == LAUNCHER_POD_SET:
        request = {"unconstrained": True}
    annotation = _topology_annotation(job, pod_set["name"])
    template = _with_metadata(pod_set["template"], {}, annotation)
    return {**pod_set, "topologyRequest": request, "template": template}


def placed_by_topology(job: DDPTrainingJob, pod_set: str, pod: Obj) -> Obj:
    """`pod` (a pod, or a pod template) of the Workload's pod set `pod_set` as Kueue's topology
    ungater finds it: held by the gate until Kueue writes its domain's node labels into its
    nodeSelector. Unchanged unless the job asks for a topology or its admission placed it by
    topology all the same (the admission marked it, and so its template, unconstrained); every
    attempt's pods are placed anew, in the domains of the admission in force."""
    marks = (pod["metadata"].get("annotations") or {}).keys()
    if job.spec.topology is None and UNCONSTRAINED_ANNOTATION not in marks:
        return pod
    topology = _topology_annotation(job, pod_set)
    annotations = {**topology, WORKLOAD_ANNOTATION: workload_name(job)}
    placed = _with_metadata(pod, {POD_SET_LABEL: pod_set}, annotations)
    spec = dict(placed["spec"])
    gates = list(spec.get("schedulingGates") or [])
    if all(gate.get("name") != TOPOLOGY_GATE for gate in gates):
        gates.append({"name": TOPOLOGY_GATE})
    return {**placed, "spec": {**spec, "schedulingGates": gates}}


def priority_class(job: DDPTrainingJob) -> Obj | None:
    """The class whose value is the Workload's priority, as Kueue's ExtractPriority picks it:
    the WorkloadPriorityClass the job's label names, else the pods' PriorityClass."""
    if name := job.metadata.labels.get(PRIORITY_CLASS_LABEL):
        return {"group": GROUP, "kind": "WorkloadPriorityClass", "name": name}
    if name := job.spec.template.priority_class_name:
        return {"group": POD_PRIORITY_GROUP, "kind": "PriorityClass", "name": name}
    return None


def flavor_path(name: str) -> str:
    """Where a ResourceFlavor (cluster-scoped) is read."""
    return f"/apis/{API_VERSION}/{RESOURCE_FLAVORS}/{names.path_segment(name)}"


def priority_class_path(ref: Mapping[str, str]) -> str:
    """Where the class `priority_class` names is read (both kinds are cluster-scoped)."""
    name = names.path_segment(ref["name"])
    if ref["group"] == GROUP:
        return f"/apis/{API_VERSION}/{PRIORITY_CLASSES}/{name}"
    return f"/apis/{POD_PRIORITY_GROUP}/v1/priorityclasses/{name}"


def workload_name(job: DDPTrainingJob) -> str:
    """Kueue's shape, `<kind>-<job>-<5 hex>`: the hash of the uid keeps a new job of the same
    name from taking over an old job's Workload."""
    digest = hashlib.sha256((job.metadata.uid or "").encode()).hexdigest()[:5]
    return f"{names.KIND.lower()}-{job.name}-{digest}"


def pod_set(name: str, count: int, pod: Mapping[str, Any]) -> Obj:
    """One pod set of `count` pods shaped like `pod` (a pod, or a pod template)."""
    pod_spec = {
        key: value
        for key, value in pod["spec"].items()
        if key not in ("hostname", "subdomain")  # per pod, not per pod set
    }
    return {
        "name": name,
        "count": count,
        "template": {
            "metadata": {"labels": dict(pod["metadata"].get("labels", {}))},
            "spec": pod_spec,
        },
    }


def pod_sets(job: DDPTrainingJob, pods: Mapping[str, Mapping[str, Any]]) -> list[Obj]:
    """The Workload's pod sets: `pods` maps a pod set's name (`POD_SET`, and with launcher
    mpi `LAUNCHER_POD_SET`) to its pods' shape; the launcher is one pod, the workers `nodes`,
    who carry the job's topology request, numbered by the label their creator gives them."""
    sets = []
    if LAUNCHER_POD_SET in pods:
        launcher = pod_set(LAUNCHER_POD_SET, 1, pods[LAUNCHER_POD_SET])
        sets.append(with_topology(job, launcher, None))
    workers = pod_set(POD_SET, job.spec.nodes, pods[POD_SET])
    mpi = job.spec.launcher == "mpi"
    index_label = names.MPI_LABEL_REPLICA_INDEX if mpi else names.LABEL_REPLICA_INDEX
    sets.append(with_topology(job, workers, index_label))
    return sets


def build_workload(
    job: DDPTrainingJob,
    pods: Mapping[str, Mapping[str, Any]],
    labels: Mapping[str, str],
    priority: int | None,
) -> Obj:
    """The job's Workload: its `pod_sets`.

    `priority` is the value of the class `priority_class` names (the caller reads it)."""
    template = job.spec.template
    before = {"nodeSelector": template.node_selector, "tolerations": template.tolerations}
    spec: Obj = {"queueName": queue_name(job), "podSets": pod_sets(job, pods)}
    ref = priority_class(job)
    if ref is not None:
        spec["priorityClassRef"] = ref
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(job),
            "namespace": job.namespace,
            "labels": {**labels, JOB_UID_LABEL: job.metadata.uid or ""},
            "annotations": {TEMPLATE_ANNOTATION: json.dumps(before, sort_keys=True)},
        },
        "spec": spec,
    }


# --- reading a Workload -------------------------------------------------------------------


def conditions(workload: Mapping[str, Any] | None) -> dict[str, Obj]:
    status = (workload or {}).get("status") or {}
    return {c.get("type", ""): c for c in status.get("conditions") or []}


def _true(workload: Mapping[str, Any] | None, type_: str) -> Obj | None:
    condition = conditions(workload).get(type_)
    return condition if condition and condition.get("status") == "True" else None


def is_admitted(workload: Mapping[str, Any] | None) -> bool:
    return _true(workload, "Admitted") is not None


def eviction(workload: Mapping[str, Any] | None) -> Obj | None:
    return _true(workload, "Evicted")


def is_finished(workload: Mapping[str, Any] | None) -> bool:
    return _true(workload, "Finished") is not None


def _admission(workload: Mapping[str, Any] | None) -> Obj:
    return dict(((workload or {}).get("status") or {}).get("admission") or {})


def _assignment(workload: Mapping[str, Any] | None, name: str) -> Obj:
    for assignment in _admission(workload).get("podSetAssignments") or []:
        if assignment.get("name") == name:
            return dict(assignment)
    return {}


def assigned_flavors(workload: Mapping[str, Any] | None, name: str = POD_SET) -> list[str]:
    """The ResourceFlavors Kueue assigned to the pod set `name` (every resource's)."""
    return sorted(set((_assignment(workload, name).get("flavors") or {}).values()))


def all_assigned_flavors(workload: Mapping[str, Any] | None) -> list[str]:
    """The ResourceFlavors Kueue assigned to any pod set: those the caller reads."""
    assignments = _admission(workload).get("podSetAssignments") or []
    return sorted({f for a in assignments for f in (a.get("flavors") or {}).values()})


def implicit_topology(workload: Mapping[str, Any], name: str = POD_SET) -> bool:
    """Whether Kueue placed the pod set `name` by topology though it asked for none (its
    flavor names a Topology): its pods are then gated like any TAS pod's."""
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    asked = any(p.get("name") == name and p.get("topologyRequest") for p in pod_sets)
    return not asked and bool(_assignment(workload, name).get("topologyAssignment"))


def admitted_template(
    workload: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]], name: str = POD_SET
) -> dict[str, Any]:
    """The pod set `name`'s nodeSelector and tolerations under this admission: the user's own
    (as kept on the Workload), the flavors' node labels and tolerations, then the admission
    checks' pod set updates (Kueue's podset.FromAssignment and Merge)."""
    kept = ((workload.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_ANNOTATION)
    before = json.loads(kept) if kept else {}
    node_selector: dict[str, str] = dict(before.get("nodeSelector") or {})
    tolerations: list[Any] = list(before.get("tolerations") or [])
    wanted: dict[str, Any] = {"nodeSelector": node_selector, "tolerations": tolerations}
    if implicit_topology(workload, name):
        wanted["annotations"] = {UNCONSTRAINED_ANNOTATION: "true"}
    for flavor in assigned_flavors(workload, name):
        flavor_spec = flavors[flavor].get("spec") or {}
        node_selector.update(flavor_spec.get("nodeLabels") or {})
        tolerations += [t for t in flavor_spec.get("tolerations") or [] if t not in tolerations]
    for check in ((workload.get("status") or {}).get("admissionChecks")) or []:
        for update in check.get("podSetUpdates") or []:
            if update.get("name") == name:
                node_selector.update(update.get("nodeSelector") or {})
                tolerations += [t for t in update.get("tolerations") or [] if t not in tolerations]
    return wanted


def _template_patch(job: DDPTrainingJob, wanted: Mapping[str, Any]) -> Obj:
    """A merge patch of spec.template to `wanted`: keys no longer wanted are set to null."""
    current = job.spec.template.node_selector
    selector: dict[str, Any] = {k: None for k in current if k not in wanted["nodeSelector"]}
    selector.update(wanted["nodeSelector"])
    patch = {"nodeSelector": selector or None, "tolerations": wanted["tolerations"] or None}
    marked = UNCONSTRAINED_ANNOTATION in job.spec.template.annotations
    if marked != (UNCONSTRAINED_ANNOTATION in (wanted.get("annotations") or {})):
        patch["annotations"] = {UNCONSTRAINED_ANNOTATION: None if marked else "true"}
    return patch


def _admission_patch(
    job: DDPTrainingJob, workload: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]]
) -> Obj:
    """The job under this admission, unsuspended: the workers' placement in spec.template;
    with launcher mpi the launcher's in an annotation (`launchers.mpi.build_mpijob` reads it), as
    the two pod sets may be given different flavors."""
    template = _template_patch(job, admitted_template(workload, flavors))
    patch: Obj = {"spec": {"runPolicy": {"suspend": False}, "template": template}}
    if job.spec.launcher == "mpi":
        launcher = admitted_template(workload, flavors, LAUNCHER_POD_SET)
        placement = json.dumps(launcher, sort_keys=True)
        patch["metadata"] = {"annotations": {names.LAUNCHER_PLACEMENT_ANNOTATION: placement}}
    return patch


# --- the contract -------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What the operator does for a queued job on this reconcile; all optional."""

    create_workload: bool = False
    job_patch: Obj | None = None  # a merge patch of the job (its spec)
    workload_status: Obj | None = None  # a merge patch of the Workload, on /status
    # Why the job is suspended, for its Suspended condition: (reason, message).
    suspended: tuple[str, str] | None = None
    refused: str | None = None  # the job cannot be queued: why (it fails, InvalidSpec)
    waiting: str | None = None  # the job cannot be queued yet: why (it waits, Pending)


def _condition(type_: str, status: str, reason: str, message: str, now: datetime) -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _with_conditions(workload: Mapping[str, Any], new: list[Obj]) -> list[Obj]:
    """The Workload's conditions with `new` set (a transition time moves only on a change)."""
    kept = conditions(workload)
    for condition in new:
        old = kept.get(condition["type"])
        same = old is not None and old.get("status") == condition["status"]
        since = old.get("lastTransitionTime") if same and old else None
        kept[condition["type"]] = {**condition, "lastTransitionTime": since} if since else condition
    return list(kept.values())


def _status_patch(workload: Mapping[str, Any], status: Obj) -> Obj:
    """A status merge patch that fails (409) if the Workload changed since it was read:
    conditions are a list, which a merge patch replaces whole."""
    version = (workload.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}, "status": status}


def plan(
    job: DDPTrainingJob,
    workload: Mapping[str, Any] | None,
    flavors: Mapping[str, Mapping[str, Any]],
    pods_active: bool,
    now: datetime,
) -> Step:
    """The next step of the contract for a job labelled with a queue (module docstring).

    `workload` is the job's (None before it exists), `flavors` the ResourceFlavors that
    `assigned_flavors(workload)` names, `pods_active` whether a worker pod still runs."""
    queue = queue_name(job)
    if queue is None:
        return Step()
    suspended = job.spec.run_policy.suspend
    phase = job.status.phase if job.status is not None else None
    if phase in ("Succeeded", "Failed"):
        if workload is None or is_finished(workload):
            return Step()
        message = f"The DDPTrainingJob {phase.lower()}"
        finished = _condition("Finished", "True", phase, message, now)
        status = {"conditions": _with_conditions(workload, [finished])}
        return Step(workload_status=_status_patch(workload, status))
    suspend = None if suspended else {"spec": {"runPolicy": {"suspend": True}}}
    if workload is None:
        message = f"Queued in LocalQueue {queue}: waiting for Kueue to admit its Workload"
        return Step(create_workload=True, job_patch=suspend, suspended=(Reason.QUEUED, message))
    evicted = eviction(workload)
    if evicted is not None:
        why = evicted.get("reason") or "Evicted"
        reason = Reason.PREEMPTED if why == "Preempted" else Reason.EVICTED
        message = f"Kueue evicted the Workload ({why}): {evicted.get('message') or ''}".rstrip()
        release = None
        if suspended and not pods_active and _admission(workload):
            # Give the quota back, as Kueue's job framework does once the job stopped.
            requeued = "True" if why in REQUEUED_AFTER else "False"
            new = [
                _condition("QuotaReserved", "False", "Pending", message, now),
                _condition("Admitted", "False", "NoReservation", message, now),
                _condition("Requeued", requeued, why, message, now),
            ]
            release = _status_patch(
                workload, {"admission": None, "conditions": _with_conditions(workload, new)}
            )
        return Step(job_patch=suspend, workload_status=release, suspended=(reason, message))
    if is_admitted(workload):
        if not suspended:
            ready = conditions(workload).get("PodsReady") or {}
            if phase != "Running" or ready.get("status") == "True":
                return Step()
            # Kueue's waitForPodsReady, where enabled, evicts a Workload that never says so.
            started = _condition("PodsReady", "True", "Started", "All workers are running", now)
            status = {"conditions": _with_conditions(workload, [started])}
            return Step(workload_status=_status_patch(workload, status))
        return Step(job_patch=_admission_patch(job, workload, flavors))
    reserved = conditions(workload).get("QuotaReserved") or {}
    waiting = reserved.get("message") or "waiting for Kueue to admit its Workload"
    cluster_queue = _admission(workload).get("clusterQueue")
    where = f"LocalQueue {queue}" + (f" (ClusterQueue {cluster_queue})" if cluster_queue else "")
    return Step(job_patch=suspend, suspended=(Reason.QUEUED, f"Queued in {where}: {waiting}"))
