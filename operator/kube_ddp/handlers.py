"""The kopf wiring: which resources are watched and how their events reach the `Controller`.

Jobs and pods are observed with stateless event handlers and an index of our pods (kopf then
writes no annotation onto our objects and puts no finalizer on jobs); every event queues its
job for one reconcile in `kube_ddp.controller`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from kube_ddp import kopf_speedups, kueue, names
from kube_ddp.config import OperatorConfig
from kube_ddp.controller import Controller, Key
from kube_ddp.kopf_insights import Insights, rediscoverer, watches
from kube_ddp.kube import Kube, load_credentials
from kube_ddp.status import MPIJobView, PodView

# Pod events of one job within this many seconds are handled together: fewer status writes
# under load, at a small cost in reaction time.
POD_EVENT_WINDOW = 0.05
# Our pods, MPIJobs and (Kueue's, for our jobs) Workloads carry `managed-by=kube-ddp`: kopf's
# label filter, and as `OURS_SELECTOR` the watch's label selector for MPIJobs and Workloads.
OURS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
OURS_SELECTOR = ",".join(f"{key}={value}" for key, value in OURS.items())
# launcher mpi: the MPI Operator's pods of our MPIJobs carry the job's name but not
# `managed-by` (launchers.mpi.mpi_pod_labels), and the MPI Operator's role label.
MPI_PODS = {names.LABEL_JOB_NAME: kopf.PRESENT, names.MPI_LABEL_ROLE: kopf.PRESENT}
MPIJOB_GROUP, MPIJOB_VERSION = names.MPIJOB_API_VERSION.split("/")


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf builds a "diff base" on every watch event, a deep copy of the object for change
    handlers to diff against; we register only event handlers and indexes, so nothing reads
    it, and with thousands of pods starting it was a tenth of the operator's CPU (py-spy)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def _controller(memo: Any) -> Controller:
    controller: Controller = memo.controller
    return controller


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorConfig = memo.config
    # Only pods of our jobs are sent by the API server (our workers and the MPI Operator's pods
    # of our MPIJobs): a busy cluster's other pods cost nothing.
    settings.watching.label_selectors["pods"] = names.LABEL_JOB_NAME
    settings.watching.label_selectors[MPIJOB_GROUP, names.MPIJOB_PLURAL] = OURS_SELECTOR
    settings.watching.label_selectors[kueue.GROUP, kueue.WORKLOADS] = OURS_SELECTOR
    # kopf would list every CRD and namespace to follow new ones: a cluster-wide right we do
    # not take, since we watch fixed resources in fixed namespaces. A job waiting for a kind
    # installed later has kopf look at that kind's group again (Controller.rediscover).
    settings.scanning.disabled = True
    settings.persistence.diffbase_storage = NoDiffBase()
    kopf_speedups.apply()  # before the first watch: startup precedes them
    memo.controller = Controller(config=config, kube=Kube())
    insights: Insights | None = getattr(memo, "insights", None)  # set by serving.run
    if insights is not None:
        memo.controller.watches_mpijobs = watches(insights, MPIJOB_GROUP, names.MPIJOB_PLURAL)
        memo.controller.watches_workloads = watches(insights, kueue.GROUP, kueue.WORKLOADS)
        registry = kopf.get_default_registry()  # kopf.operator's, as serving.run gives none
        memo.controller.rediscover = rediscoverer(insights, settings, registry)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    controller = _controller(memo)
    await controller.queue.close()
    await controller.kube.close()


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """The same credentials as our own calls (kopf would prefer a client library's)."""
    return load_credentials()


# The indexes are async functions: kopf runs a plain one in a thread pool, a hop that cost about
# a tenth of the operator's CPU when thousands of pods start (py-spy, docs/BENCHMARKS.md).
@kopf.index("pods", labels=OURS)
async def ddp_pods(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> Any:
    """Our pods by (namespace, job name), as the status core sees them."""
    job = labels.get(names.LABEL_JOB_NAME)
    return {(namespace, job): PodView.from_pod(body)} if job else None


@kopf.index("pods", labels=MPI_PODS)
async def mpi_pods(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> Any:
    """launcher mpi: the MPI Operator's launcher and workers by (namespace, job name)."""
    return {(namespace, labels[names.LABEL_JOB_NAME]): PodView.from_mpi_pod(body)}


def _index(controller: Controller, kwargs: Mapping[str, Any]) -> None:
    controller.pods = kwargs["ddp_pods"]
    controller.mpi_pods = kwargs["mpi_pods"]


@kopf.on.event(names.GROUP, names.VERSION, names.PLURAL)
async def job_event(
    type: str, event: kopf.RawEvent, name: str, namespace: str | None, memo: Any, **kwargs: Any
) -> None:
    controller = _controller(memo)
    _index(controller, kwargs)
    key: Key = (namespace or "default", name)
    if type == "DELETED":
        controller.job_deleted(key, event["object"].get("metadata", {}).get("uid"))
    else:
        controller.job_changed(key, dict(event["object"]))


@kopf.on.event("pods")
async def pod_event(
    type: str,
    namespace: str | None,
    labels: Mapping[str, str],
    body: kopf.Body,
    memo: Any,
    **kwargs: Any,
) -> None:
    """Our workers and the MPI Operator's pods of our MPIJobs (the watch's label selector)."""
    controller = _controller(memo)
    _index(controller, kwargs)
    job = labels.get(names.LABEL_JOB_NAME)
    if job and namespace:
        pod = PodView.from_pod(body)
        if type == "DELETED" and labels.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY:
            controller.pod_deleted((namespace, job), pod)
        controller.pod_changed((namespace, job), pod, POD_EVENT_WINDOW)


@kopf.on.event(MPIJOB_GROUP, MPIJOB_VERSION, names.MPIJOB_PLURAL, labels=OURS)
async def mpijob_event(
    type: str,
    event: kopf.RawEvent,
    namespace: str | None,
    name: str | None,
    memo: Any,
    **kwargs: Any,
) -> None:
    """launcher mpi: our MPIJobs, kept by the controller. Not a kopf index: kopf holds every
    handler until all its indexes are filled, which would tie torchrun jobs to a kind that is
    served only where the MPI Operator is installed. An MPIJob is kept for the job it is named
    after (build_mpijob's name), never for the job its labels name: anyone who may make MPIJobs
    can copy labels, and its owner's uid is checked against the job's (`decide_mpi`)."""
    controller = _controller(memo)
    _index(controller, kwargs)
    if name and namespace:
        view = None if type == "DELETED" else MPIJobView.from_mpijob(event["object"])
        controller.mpijob_changed((namespace, name), view, POD_EVENT_WINDOW)


@kopf.on.event(kueue.GROUP, kueue.VERSION, kueue.WORKLOADS, labels=OURS)
async def workload_event(
    namespace: str | None, labels: Mapping[str, str], memo: Any, **kwargs: Any
) -> None:
    """Kueue admitted, evicted or requeued one of our Workloads: reconcile its job. Served once kopf
    found the Workload kind: at its start, or when a queued job had it look again."""
    controller = _controller(memo)
    _index(controller, kwargs)
    job = labels.get(names.LABEL_JOB_NAME)
    if job and namespace:
        controller.queue.add((namespace, job))
