"""Each launcher in one unit: what it builds for an attempt, the pods it reads and the kinds it
watches. `launcher_of(job)` is the job's; the controller and `render` ask it once instead of
testing `spec.launcher`. Pure, like `builders`: a job in, objects out. `status.decide` finds
each launcher's path (`status.torchrun`, `status.mpi`) by the same name, in `status.PATHS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kube_ddp import gang, names
from kube_ddp.api import DDPTrainingJob, Obj
from kube_ddp.builders import (
    BuildSettings,
    build_network_policy,
    build_reporter_rbac,
    job_labels,
)
from kube_ddp.launchers import mpi, torchrun

Build = Callable[
    [
        DDPTrainingJob,
        int,
        BuildSettings,
        Sequence[Obj],
        Iterable[int] | None,
        Sequence[str],
        Sequence[str],
    ],
    list[Obj],
]


@dataclass(frozen=True)
class Launcher:
    """What the operator makes and follows for a job of one launcher."""

    name: str
    # The job's children for an attempt, in creation order, the `shared` ones among them.
    build: Build
    # The pods of each of the job's Kueue pod sets, by the pod set's name.
    kueue_pods: Callable[[DDPTrainingJob, BuildSettings], dict[str, Obj]]
    # The kinds of its children the operator watches: a job cannot run where one is not served.
    kinds: frozenset[str]
    # The kopf index of the pods `status.decide` reads (`handlers.ddp_pods`, `handlers.mpi_pods`).
    pod_index: str
    # Whether the operator makes the pods itself (they are its to delete), or another operator.
    owns_pods: bool


TORCHRUN = Launcher(
    name="torchrun",
    build=torchrun.build,
    kueue_pods=torchrun.kueue_pods,
    kinds=frozenset({"Pod"}),
    pod_index="ddp_pods",
    owns_pods=True,
)
MPI = Launcher(
    name="mpi",
    build=mpi.build,
    kueue_pods=mpi.kueue_pods,
    kinds=frozenset({names.MPIJOB_KIND, "Pod"}),
    pod_index="mpi_pods",
    owns_pods=False,
)
LAUNCHERS = {launcher.name: launcher for launcher in (TORCHRUN, MPI)}


def launcher_of(job: DDPTrainingJob) -> Launcher:
    """The job's launcher (`spec.launcher`)."""
    return LAUNCHERS[job.spec.launcher]


def build_children(
    job: DDPTrainingJob,
    attempt: int = 0,
    settings: BuildSettings | None = None,
    indices: Iterable[int] | None = None,
    pod_names: Sequence[str] = (),
    avoid_nodes: Sequence[str] = (),
) -> list[Obj]:
    """Everything the operator creates for `job` at `attempt` (only the worker pods in
    `indices`, when given, under `pod_names` where given, preferring nodes other than
    `avoid_nodes`), in creation order: the
    NetworkPolicy before any pod, so none is open for a moment; pods last, since they name the
    ServiceAccount (and their PodGroup, which must exist before its pods are scheduled)."""
    settings = settings or BuildSettings()
    rbac = build_reporter_rbac(job)
    policy = build_network_policy(job, settings)
    guarded = [policy] if policy is not None else []
    pod_group = gang.build_pod_group(job, job_labels(job))
    grouped = [pod_group] if pod_group else []
    shared = [*guarded, *rbac, *grouped]
    return launcher_of(job).build(job, attempt, settings, shared, indices, pod_names, avoid_nodes)


def kueue_pods(job: DDPTrainingJob, settings: BuildSettings) -> dict[str, Obj]:
    """The pods of each of the job's Kueue pod sets, by the pod set's name: the worker pod;
    with launcher mpi the MPIJob's launcher and worker templates (Kueue counts their
    requests; `kueue.build_workload` makes the pod sets)."""
    return launcher_of(job).kueue_pods(job, settings)
