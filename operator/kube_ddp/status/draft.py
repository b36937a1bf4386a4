"""What the status core decides (actions, Events, the `Decision`), and the `Draft` one decision
builds them in."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kube_ddp.api import Condition, ConditionType, JobStatus, Phase

if TYPE_CHECKING:
    from datetime import datetime

    from kube_ddp.status.views import PodView


@dataclass(frozen=True)
class CreateWorkers:
    """Create the Service and the worker pods of `attempt` that do not exist yet: workers
    `indices`, under `pod_names` (one per index; empty: each worker's first name)."""

    attempt: int
    indices: tuple[int, ...]
    pod_names: tuple[str, ...] = ()
    avoid_nodes: tuple[str, ...] = ()  # nodes the pods prefer not to run on


@dataclass(frozen=True)
class DeletePods:
    """Delete pods; `force`: with grace period 0, for pods whose node stopped reporting (its
    kubelet will never confirm a graceful deletion); else `grace_seconds` (None: each pod's
    own), time for the workers to save a checkpoint (`builders.termination_grace_seconds`).
    `uids`, one per name where known: each pod is deleted only while its name is still that pod
    (the name may be its successor's by the time the delete arrives)."""

    names: tuple[str, ...]
    force: bool = False
    grace_seconds: int | None = None
    uids: tuple[str | None, ...] = ()

    def targets(self) -> list[tuple[str, str | None]]:
        """Each pod to delete: its name, and its uid if known."""
        return list(zip(self.names, self.uids or (None,) * len(self.names), strict=True))


@dataclass(frozen=True)
class DeleteJob:
    """ttlSecondsAfterFinished has passed."""


@dataclass(frozen=True)
class DeleteMPIJob:
    """launcher mpi: remove the attempt's MPIJob (and, through it, its pods) before a restart."""

    name: str


@dataclass(frozen=True)
class SuspendMPIJob:
    """launcher mpi: set the MPIJob's runPolicy.suspend; the MPI Operator stops or starts its
    pods."""

    name: str
    suspend: bool


Action = CreateWorkers | DeletePods | DeleteJob | DeleteMPIJob | SuspendMPIJob


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    status: JobStatus
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None  # seconds until a time-based rule fires


def set_condition(
    conditions: Iterable[Condition],
    type_: ConditionType,
    status: Literal["True", "False"],
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    """Conditions with `type_` set; its transition time moves only when its status changes."""
    result, found = [], False
    for condition in conditions:
        if condition.type != type_:
            result.append(condition)
            continue
        found = True
        moved = condition.status != status
        result.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=now if moved else condition.last_transition_time,
            )
        )
    if not found:
        result.append(
            Condition(
                type=type_, status=status, reason=reason, message=message, last_transition_time=now
            )
        )
    return result


def condition_status(status: JobStatus, type_: ConditionType) -> str | None:
    return next((c.status for c in status.conditions if c.type == type_), None)


@dataclass
class Draft:
    """The status being built by one decision, with the actions and events it implies."""

    status: JobStatus
    now: datetime
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    grace_seconds: int | None = None  # what the operator's own deletes give each pod

    def update(self, **changes: Any) -> None:
        self.status = self.status.model_copy(update=changes)

    def condition(
        self, type_: ConditionType, status: Literal["True", "False"], reason: str, message: str
    ) -> None:
        conditions = set_condition(self.status.conditions, type_, status, reason, message, self.now)
        self.update(conditions=conditions)

    def phase(self, phase: Phase, reason: str, message: str, warning: bool = False) -> None:
        """Move to `phase`; a change of phase is also a Kubernetes Event."""
        if self.status.phase != phase:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))
        self.update(phase=phase)

    def delete(self, pods: Iterable[PodView]) -> None:
        """Delete `pods`, skipping those already going; repeated deletes are harmless."""
        doomed = [p for p in pods if not p.deleting]
        if doomed:
            self.actions.append(_deleting(doomed, grace_seconds=self.grace_seconds))

    def force_delete(self, pods: Iterable[PodView]) -> None:
        if doomed := list(pods):
            self.actions.append(_deleting(doomed, force=True))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def decision(self) -> Decision:
        return Decision(self.status, tuple(self.actions), tuple(self.events), self.requeue_after)


def _deleting(
    pods: Iterable[PodView], force: bool = False, grace_seconds: int | None = None
) -> DeletePods:
    """The action that deletes `pods`, each once, by uid where it is known."""
    doomed = sorted({(p.name, p.uid or "") for p in pods})
    uids = tuple(uid or None for _, uid in doomed) if any(uid for _, uid in doomed) else ()
    return DeletePods(tuple(name for name, _ in doomed), force, grace_seconds, uids)
