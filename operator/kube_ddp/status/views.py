"""What the status core reads of the world: a worker pod (`PodView`) and, for `launcher: mpi`,
the MPIJob (`MPIJobView`), each taken from the object the API server returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kube_ddp import names


@dataclass(frozen=True)
class PodView:
    """What the core needs to know of one worker pod."""

    name: str
    index: int
    attempt: int
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    # metadata.uid: a pod deleted and created again under the same name is another pod
    uid: str | None = None
    deleting: bool = False
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    finished_at: str | None = None
    scheduled: bool = False
    unschedulable: str | None = None  # the scheduler's message when it cannot place the pod
    cannot_start: str | None = None  # the kubelet's words when it cannot start a container
    # Since when the kubelet has been creating its containers (placed, none created yet: the
    # volumes are mounted then); None otherwise.
    creating_since: str | None = None
    # The kubelet's FailedMount Event while it is so: the shell reads it (`with_mount_failure`)
    cannot_mount: str | None = None
    owner_uid: str | None = None  # its controlling owner's, as are the next
    owner_kind: str | None = None
    owner_name: str | None = None
    role: str | None = None  # launcher mpi: the MPI Operator's "launcher" or "worker"
    created_at: str | None = None
    node: str | None = None  # spec.nodeName
    # metadata.deletionTimestamp: when its grace period ends and its kubelet should have
    # removed it
    deletion_deadline: str | None = None
    # when its Ready condition went False (the node controller marks every pod of a node that
    # stopped reporting not ready)
    unready_since: str | None = None

    @property
    def active(self) -> bool:
        return self.phase in ("Pending", "Running") and not self.deleting

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView:
        metadata = pod.get("metadata", {})
        labels = metadata.get("labels", {})
        status = pod.get("status", {})
        terminated = _terminated_state(status)
        conditions = {c.get("type"): c for c in status.get("conditions", [])}
        scheduled = conditions.get("PodScheduled", {})
        unschedulable = None
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            unschedulable = scheduled.get("message") or "the scheduler cannot place this pod"
        owners = [o for o in metadata.get("ownerReferences", []) if o.get("controller")]
        # Set when the pod is taken away (node gone, eviction, preemption) before it ends.
        disruption = conditions.get("DisruptionTarget", {})
        disrupted = disruption if disruption.get("status") == "True" else {}
        ready = conditions.get("Ready", {})
        return cls(
            name=metadata.get("name", ""),
            uid=metadata.get("uid"),
            index=_int(labels.get(names.LABEL_REPLICA_INDEX)),
            attempt=_int(labels.get(names.LABEL_ATTEMPT)),
            phase=status.get("phase") or "Pending",
            deleting=metadata.get("deletionTimestamp") is not None,
            exit_code=terminated.get("exitCode"),
            reason=disrupted.get("reason") or status.get("reason") or terminated.get("reason"),
            message=disrupted.get("message") or status.get("message") or terminated.get("message"),
            finished_at=terminated.get("finishedAt"),
            scheduled=bool(pod.get("spec", {}).get("nodeName"))
            or scheduled.get("status") == "True",
            unschedulable=unschedulable,
            cannot_start=_cannot_start(status),
            creating_since=_creating_since(status, scheduled),
            owner_uid=owners[0].get("uid") if owners else None,
            owner_kind=owners[0].get("kind") if owners else None,
            owner_name=owners[0].get("name") if owners else None,
            created_at=metadata.get("creationTimestamp"),
            node=pod.get("spec", {}).get("nodeName"),
            deletion_deadline=metadata.get("deletionTimestamp"),
            unready_since=ready.get("lastTransitionTime")
            if ready.get("status") == "False"
            else None,
        )

    @classmethod
    def from_mpi_pod(cls, pod: Mapping[str, Any]) -> PodView:
        """A launcher or worker pod the MPI Operator made for one of our MPIJobs."""
        labels = pod.get("metadata", {}).get("labels", {})
        return dataclasses.replace(
            cls.from_pod(pod),
            index=_int(labels.get(names.MPI_LABEL_REPLICA_INDEX)),
            role=labels.get(names.MPI_LABEL_ROLE),
        )


@dataclass(frozen=True)
class MPIJobView:
    """What the core needs to know of the MPIJob of a `launcher: mpi` job."""

    name: str
    attempt: int
    deleting: bool = False
    suspended: bool = False  # spec.runPolicy.suspend
    conditions: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    completed: bool = False  # completionTime is set: Succeeded or Failed for good
    created_at: datetime | None = None
    uid: str | None = None
    owner_uid: str | None = None  # its controlling owner's: the job that made it

    def true(self, type_: str) -> bool:
        return self.conditions.get(type_, ("False", "", ""))[0] == "True"

    @property
    def succeeded(self) -> bool:
        return self.true("Succeeded")

    @property
    def failed(self) -> bool:
        # Failed without completionTime (an evicted worker) can still end Succeeded.
        return self.true("Failed") and self.completed

    @classmethod
    def from_mpijob(cls, body: Mapping[str, Any]) -> MPIJobView:
        metadata = body.get("metadata", {})
        status = body.get("status") or {}
        return cls(
            name=metadata.get("name", ""),
            attempt=_int(metadata.get("labels", {}).get(names.LABEL_ATTEMPT)),
            deleting=metadata.get("deletionTimestamp") is not None,
            suspended=bool(body.get("spec", {}).get("runPolicy", {}).get("suspend")),
            conditions={
                c.get("type", ""): (c.get("status", ""), c.get("reason", ""), c.get("message", ""))
                for c in status.get("conditions") or []
            },
            completed=status.get("completionTime") is not None,
            created_at=_timestamp(metadata.get("creationTimestamp")),
            uid=metadata.get("uid"),
            owner_uid=next(
                (o.get("uid") for o in metadata.get("ownerReferences", []) if o.get("controller")),
                None,
            ),
        )


def _timestamp(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1


def _terminated_state(status: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer container's terminated state (the first container's if renamed)."""
    containers = status.get("containerStatuses") or []
    chosen = next((c for c in containers if c.get("name") == names.TRAINER_CONTAINER), None)
    chosen = chosen or (containers[0] if containers else {})
    return dict(chosen.get("state", {}).get("terminated") or {})


# The kubelet's waiting reasons for a container it cannot start and keeps retrying: the pod
# stays Pending, and only its container status says why.
STUCK_WAITING_REASONS = frozenset(
    {
        "CreateContainerConfigError",  # "image will run as root" under runAsNonRoot, a Secret
        "CreateContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
    }
)


# The kubelet's waiting reasons before it has created any container of the pod.
CREATING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})


def _creating_since(status: Mapping[str, Any], scheduled: Mapping[str, Any]) -> str | None:
    """When the pod was placed, if it is Pending with no container created yet."""
    if status.get("phase", "Pending") != "Pending" or scheduled.get("status") != "True":
        return None
    containers = (*status.get("initContainerStatuses", []), *status.get("containerStatuses", []))
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting is None or waiting.get("reason") not in CREATING_REASONS:
            return None
    return scheduled.get("lastTransitionTime")


def creating_for(pod: PodView, now: datetime) -> float | None:
    """Seconds `pod` has been creating its containers; None when it is not."""
    since = _timestamp(pod.creating_since)
    return (now - since).total_seconds() if since is not None else None


def mount_look_due(pod: PodView, now: datetime) -> bool:
    """Whether the shell should read `pod`'s FailedMount Events: it has been creating its
    containers for names.MOUNT_LOOK_AFTER_SECONDS."""
    seconds = creating_for(pod, now)
    return seconds is not None and seconds >= names.MOUNT_LOOK_AFTER_SECONDS


# What to change, for a kubelet message that names the cause but not the job's field.
CANNOT_START_FIXES = {
    "image will run as root": "the image's user is root: give the job "
    "template.securityContext.runAsUser: 0 (kube-ddp then leaves runAsNonRoot out; the pods "
    "meet the baseline Pod Security Standard, not restricted), or an image with a non-root USER",
    'configmap "': "create that ConfigMap in the job's namespace (the kubelet keeps retrying "
    "and the workers start once it exists), or name an existing one in template.volumes",
    'secret "': "create that Secret in the job's namespace (the kubelet keeps retrying and the "
    "workers start once it exists), or name an existing one in template.volumes",
}


def mount_failure(message: str) -> str:
    """The words for ContainersStarted=False of a FailedMount Event's `message`."""
    fixes = [fix for cause, fix in CANNOT_START_FIXES.items() if cause in message]
    return ": ".join(["volume not mounted (kubelet, FailedMount)", message, *fixes])


def _cannot_start(status: Mapping[str, Any]) -> str | None:
    """`container <name>: <reason>: <message>[: <fix>]` for the first container (init
    containers first) the kubelet cannot start; None when none is stuck."""
    for container in (
        *status.get("initContainerStatuses", []),
        *status.get("containerStatuses", []),
    ):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING_REASONS:
            said = f"container {container.get('name')}: {waiting['reason']}"
            message = waiting.get("message") or ""
            fixes = [fix for cause, fix in CANNOT_START_FIXES.items() if cause in message]
            return ": ".join([said, *([message] if message else []), *fixes])
    return None
