"""launcher torchrun: a Service and one pod per node, each running torchrun (or the user's
own command); the operator makes the pods itself, `status.torchrun` follows them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kube_ddp import gang, kueue, names
from kube_ddp.api import DDPTrainingJob, Obj
from kube_ddp.builders import (
    BuildSettings,
    _container,
    _metadata,
    _pod_metadata,
    _pod_spec,
    avoiding,
    job_labels,
    node_lost_tolerations,
    torchrun_command,
    trainer_args,
    user_command,
    worker_env,
    worker_labels,
)


def build_service(job: DDPTrainingJob) -> Obj:
    """The headless Service giving every worker a stable DNS name before it is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, job.name, job_labels(job)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": job_labels(job),
            "ports": [{"name": "ddp", "port": job.spec.port, "targetPort": job.spec.port}],
        },
    }


def build_worker_pod(
    job: DDPTrainingJob,
    index: int,
    attempt: int,
    settings: BuildSettings,
    name: str | None = None,
    avoid_nodes: Sequence[str] = (),
) -> Obj:
    """Worker `index` of attempt `attempt` (torchrun launcher), named `name` (a successor's,
    `names.successor_name`) or the worker's first name, preferring nodes other than
    `avoid_nodes`."""
    spec = job.spec
    if spec.command is not None:
        command, args = user_command(job, index), list(spec.args or [])
    else:
        command, args = torchrun_command(job, index), trainer_args(job)
    env = worker_env(job, index, attempt)
    container = _container(
        job,
        name=names.TRAINER_CONTAINER,
        command=command,
        args=args,
        env=env,
        settings=settings,
        attempt=attempt,
    )
    pod_spec = _pod_spec(job, [container])
    pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *node_lost_tolerations(job)]
    if avoid_nodes:
        pod_spec["affinity"] = avoiding(pod_spec.get("affinity"), avoid_nodes)
    pod_spec["hostname"] = names.worker_name(job.name, index)
    pod_spec["subdomain"] = job.name
    name = name or names.worker_name(job.name, index)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _pod_metadata(job, name, worker_labels(job, index, attempt)),
        "spec": pod_spec,
    }


def build_worker_pods(
    job: DDPTrainingJob,
    attempt: int,
    settings: BuildSettings,
    indices: Iterable[int] | None = None,
    pod_names: Sequence[str] = (),
    avoid_nodes: Sequence[str] = (),
) -> list[Obj]:
    chosen = list(range(job.spec.nodes) if indices is None else indices)
    named: Sequence[str | None] = pod_names or [None] * len(chosen)
    return [
        build_worker_pod(job, i, attempt, settings, name, avoid_nodes)
        for i, name in zip(chosen, named, strict=True)
    ]


def build(
    job: DDPTrainingJob,
    attempt: int,
    settings: BuildSettings,
    shared: Sequence[Obj],
    indices: Iterable[int] | None = None,
    pod_names: Sequence[str] = (),
    avoid_nodes: Sequence[str] = (),
) -> list[Obj]:
    """The job's children for `attempt`: the Service the workers' hostnames resolve through,
    the `shared` children, then the worker pods (`launchers.build_children` says which)."""
    pods = [
        kueue.placed_by_topology(job, kueue.POD_SET, gang.join(job, p))
        for p in build_worker_pods(job, attempt, settings, indices, pod_names, avoid_nodes)
    ]
    return [build_service(job), *shared, *pods]


def kueue_pods(job: DDPTrainingJob, settings: BuildSettings) -> dict[str, Obj]:
    """Kueue's one pod set: the worker pod."""
    return {kueue.POD_SET: gang.join(job, build_worker_pod(job, 0, 0, settings))}
