"""Pure builders of gang (all-or-nothing) scheduling: a job's PodGroup, and what its worker
pods carry to join it, for the three schedulers `spec.scheduling.gang.scheduler` names. A gang
that names none gets the first of `AUTO_ORDER` the cluster serves (`resolve`, given what the
shell found served): most clusters run one of them at most, and which one is theirs to say.

- kubernetes: `scheduling.k8s.io/v1alpha2` (`spec.schedulingPolicy.gang.minCount`); a worker
  names it in `spec.schedulingGroup.podGroupName`; the pod's own scheduler (default-scheduler).
- coscheduling (scheduler-plugins): `scheduling.x-k8s.io/v1alpha1` (`spec.minMember`); label
  `scheduling.x-k8s.io/pod-group`; schedulerName `scheduler-plugins-scheduler`.
- volcano: `scheduling.volcano.sh/v1beta1` (`spec.minMember`); annotation
  `scheduling.k8s.io/group-name`; schedulerName `volcano`.

One PodGroup per job, named after it and owned by it (the caller adopts it like the other
children): the gang's size cannot change on a live job (`nodes` and `scheduling` are
immutable), so every attempt reuses it. `spec.template.schedulerName`, when set, wins over
the scheduler's default name (a second scheduler installed under another name).

With launcher mpi the MPIJob's launcher and worker templates join it, and the gang counts the
launcher too (`minMember` workers + 1): the MPI Operator copies a template's labels,
annotations and schedulerName onto the pods it creates. Its own `runPolicy.schedulingPolicy`
is left unset: it is read only when the MPI Operator runs with `--gang-scheduling`, which
makes a PodGroup of the same name (the MPIJob's, which is the job's) owned by the MPIJob.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from kube_ddp.api import DDPTrainingJob, GangPolicy, Obj


@dataclass(frozen=True)
class GangKind:
    """What one scheduler's PodGroup is and how a pod names it."""

    api_version: str
    scheduler_name: str | None  # the pods' schedulerName unless the template names one
    label: str | None = None  # the pod label that names the group
    annotation: str | None = None  # the pod annotation that names the group
    installed_by: str = ""  # what a cluster that does not serve the kind needs

    @property
    def kind(self) -> str:
        return "PodGroup"

    @property
    def plural(self) -> str:
        return "podgroups"


KINDS: Final[dict[str, GangKind]] = {
    "kubernetes": GangKind(
        api_version="scheduling.k8s.io/v1alpha2",
        scheduler_name=None,
        installed_by="Kubernetes 1.36 with the GenericWorkload and GangScheduling feature gates "
        "(kube-apiserver, kube-scheduler, kube-controller-manager) and "
        "--runtime-config=scheduling.k8s.io/v1alpha2=true",
    ),
    "coscheduling": GangKind(
        api_version="scheduling.x-k8s.io/v1alpha1",
        # The name scheduler-plugins' Helm chart (as-a-second-scheduler) gives its scheduler.
        scheduler_name="scheduler-plugins-scheduler",
        label="scheduling.x-k8s.io/pod-group",
        installed_by="the scheduler-plugins coscheduling plugin and its PodGroup CRD",
    ),
    "volcano": GangKind(
        api_version="scheduling.volcano.sh/v1beta1",
        scheduler_name="volcano",
        annotation="scheduling.k8s.io/group-name",
        installed_by="Volcano (its scheduler, controllers and CRDs)",
    ),
}


# Kubernetes' own first: served only where its alpha gates were turned on, by choice, and it
# needs no second scheduler. Volcano before coscheduling: its PodGroup is the one batch
# platforms install most.
AUTO_ORDER: Final = ("kubernetes", "volcano", "coscheduling")


def candidates(job: DDPTrainingJob) -> tuple[str, ...]:
    """The schedulers the job's gang may use: the one it names, else AUTO_ORDER (launcher mpi:
    without kubernetes, whose pods' schedulingGroup the MPI Operator drops)."""
    gang = gang_of(job)
    if gang is None:
        return ()
    if gang.scheduler is not None:
        return (gang.scheduler,)
    mpi = job.spec.launcher == "mpi"
    return tuple(s for s in AUTO_ORDER if not (mpi and s == "kubernetes"))


def scheduler_of(job: DDPTrainingJob) -> str:
    """The gang's scheduler: the one named or resolved, else the first candidate (what `render`
    shows, with no cluster to ask)."""
    return candidates(job)[0]


def resolve(job: DDPTrainingJob, served: Collection[str]) -> DDPTrainingJob | str:
    """`job` with its gang's scheduler named: the first candidate whose PodGroup apiVersion is
    in `served`. Unchanged without a gang or with a named scheduler; the reason it cannot run
    where no candidate is served."""
    scheduling = job.spec.scheduling
    gang = scheduling.gang if scheduling is not None else None
    if scheduling is None or gang is None or gang.scheduler is not None:
        return job
    for scheduler in candidates(job):
        if KINDS[scheduler].api_version in served:
            chosen = gang.model_copy(update={"scheduler": scheduler})
            named = scheduling.model_copy(update={"gang": chosen})
            return job.model_copy(
                update={"spec": job.spec.model_copy(update={"scheduling": named})}
            )
    kinds = ", ".join(f"{s} ({KINDS[s].kind} {KINDS[s].api_version})" for s in candidates(job))
    return (
        "scheduling.gang names no scheduler and this cluster serves the PodGroup of none of "
        f"{kinds}: the job waits until one is (install Volcano or scheduler-plugins' "
        "coscheduling), or remove scheduling.gang (a job queued in Kueue waits until all of "
        "it fits without one)"
    )


def gang_of(job: DDPTrainingJob) -> GangPolicy | None:
    scheduling = job.spec.scheduling
    return scheduling.gang if scheduling is not None else None


def pod_group_name(job: DDPTrainingJob) -> str:
    return job.name


def min_workers(job: DDPTrainingJob) -> int:
    """Workers placed together: minMember, else nodes (elastic: minNodes, what it can run on)."""
    spec = job.spec
    if spec.gang_min_member is not None:
        return spec.gang_min_member
    return spec.elastic.min_nodes if spec.elastic is not None else spec.nodes


def min_member(job: DDPTrainingJob) -> int:
    """Pods placed together: the workers, and with launcher mpi the launcher."""
    return min_workers(job) + (1 if job.spec.launcher == "mpi" else 0)


def build_pod_group(job: DDPTrainingJob, labels: dict[str, str]) -> Obj | None:
    """The job's PodGroup with `labels` (the job's children's), or None without a gang."""
    gang = gang_of(job)
    if gang is None:
        return None
    scheduler = scheduler_of(job)
    kind = KINDS[scheduler]
    count = min_member(job)
    spec: Obj
    if scheduler == "kubernetes":
        spec = {"schedulingPolicy": {"gang": {"minCount": count}}}
    else:
        spec = {"minMember": count}
        if gang.schedule_timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
        if gang.queue is not None:
            spec["queue"] = gang.queue
        if scheduler == "volcano" and job.spec.template.priority_class_name:
            spec["priorityClassName"] = job.spec.template.priority_class_name
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": pod_group_name(job),
            "namespace": job.namespace,
            "labels": labels,
        },
        "spec": spec,
    }


def join(job: DDPTrainingJob, pod: Obj) -> Obj:
    """`pod` (a worker) as a member of the job's gang; unchanged without a gang."""
    gang = gang_of(job)
    if gang is None:
        return pod
    kind = KINDS[scheduler_of(job)]
    group = pod_group_name(job)
    metadata = dict(pod["metadata"])
    spec = dict(pod["spec"])
    if kind.label:
        metadata["labels"] = {**metadata.get("labels", {}), kind.label: group}
    if kind.annotation:
        metadata["annotations"] = {**metadata.get("annotations", {}), kind.annotation: group}
    if scheduler_of(job) == "kubernetes":
        spec["schedulingGroup"] = {"podGroupName": group}
    if kind.scheduler_name and "schedulerName" not in spec:
        spec["schedulerName"] = kind.scheduler_name
    return {**pod, "metadata": metadata, "spec": spec}


def describe(job: DDPTrainingJob) -> str | None:
    """How status messages name the gang: `PodGroup <name> (3 of 3 workers together)`."""
    if gang_of(job) is None:
        return None
    together = f"{min_workers(job)} of {job.spec.nodes} workers"
    if job.spec.launcher == "mpi":
        together = f"the launcher and {together}"
    return f"PodGroup {pod_group_name(job)} ({together} together)"


def not_served(job: DDPTrainingJob) -> str:
    """Why a job whose PodGroup kind the cluster does not serve cannot run."""
    scheduler = scheduler_of(job)
    kind = KINDS[scheduler]
    return (
        f"scheduling.gang.scheduler {scheduler} needs {kind.kind} {kind.api_version}, which this "
        f"cluster does not serve: it needs {kind.installed_by}; the job waits until it is "
        "served, or remove scheduling.gang"
    )
