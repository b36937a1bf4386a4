"""The kopf shell: watch jobs and their pods, ask the status core, apply what it decides.

No decision is made here. Jobs and pods are observed with stateless event handlers and an
index (kopf writes nothing onto our pods and puts no finalizer on jobs); every event queues
its job for one reconcile, which reads the job and its pods, calls `status.decide`, creates
or deletes children, and writes the status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import ValidationError

from kube_ddp import metrics, names
from kube_ddp.api import DDPTrainingJob, JobStatus, describe_errors, load_job
from kube_ddp.builders import BuildSettings, build_children, build_event
from kube_ddp.config import OperatorConfig
from kube_ddp.kube import ApiError, Kube, load_credentials
from kube_ddp.status import (
    Action,
    CreateWorkers,
    Decision,
    DeleteJob,
    DeletePods,
    PodView,
    decide,
    reject,
)
from kube_ddp.workqueue import WorkQueue

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, job name)
# Pod events of one job within this many seconds are handled together: fewer status writes
# under load, at a small cost in reaction time.
POD_EVENT_WINDOW = 0.05
REFUSED = (400, 422)  # the API server's verdict on an object: retrying cannot help
MPI_OPERATOR_MISSING = (
    "launcher mpi needs the MPI Operator (kubeflow.org/v2beta1 MPIJob), which this cluster "
    "does not serve: install it, or use launcher: torchrun"
)
OUR_PODS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# --- in-memory state of the shell -------------------------------------------------------------


@dataclass
class Expectations:
    """Pods we created that the watch has not shown yet (Kubernetes' "expectations")."""

    timeout: float
    _pending: dict[Key, dict[str, float]] = field(default_factory=dict)

    def expect(self, key: Key, pod_names: Iterable[str], now: float) -> None:
        self._pending.setdefault(key, {}).update(dict.fromkeys(pod_names, now + self.timeout))

    def observe(self, key: Key, pod_name: str) -> None:
        self._pending.get(key, {}).pop(pod_name, None)

    def pending(self, key: Key, now: float) -> list[str]:
        waiting = {n: t for n, t in self._pending.get(key, {}).items() if t > now}
        self._pending[key] = waiting
        return list(waiting)

    def forget(self, key: Key) -> None:
        self._pending.pop(key, None)


def _resource_version(body: dict[str, Any]) -> int:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


@dataclass
class JobCache:
    """The newest body of each job: from the watch, or from our own status writes.

    After a status write, the watch may still deliver older versions of the job for a while;
    deciding on those would repeat a decision (a second restart), so the newest wins.
    """

    _bodies: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def offer(self, key: Key, body: dict[str, Any]) -> None:
        known = self._bodies.get(key)
        if known is None or _resource_version(body) >= _resource_version(known):
            self._bodies[key] = body

    def get(self, key: Key) -> dict[str, Any] | None:
        return self._bodies.get(key)

    def drop(self, key: Key) -> None:
        self._bodies.pop(key, None)

    def statuses(self) -> list[dict[str, Any]]:
        return [body.get("status") or {} for body in list(self._bodies.values())]


@dataclass
class Operator:
    """Everything the handlers share; kept in kopf's memo."""

    config: OperatorConfig
    kube: Kube
    queue: WorkQueue[Key] = field(init=False)
    jobs: JobCache = field(default_factory=JobCache)
    expectations: Expectations = field(init=False)
    pods: Any = None  # the `ddp_pods` kopf index, captured from the first handler call
    failures: dict[Key, int] = field(default_factory=dict)  # consecutive failed reconciles

    def __post_init__(self) -> None:
        self.expectations = Expectations(self.config.expectation_timeout)
        self.queue = WorkQueue(self.reconcile_or_retry, workers=self.config.workers)

    @property
    def build_settings(self) -> BuildSettings:
        return BuildSettings(trainer_image=self.config.trainer_image)

    # --- reconcile ---------------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        body = self.jobs.get(key)
        if body is None:
            return
        now = utcnow()
        status = JobStatus.model_validate(body.get("status") or {})
        try:
            job = load_job(body)
        except ValidationError as error:
            await self._apply(key, body, status, reject(status, describe_errors(error), now))
            return
        pods = list(self.pods.get(key, [])) if self.pods is not None else []
        expected = self.expectations.pending(key, asyncio.get_running_loop().time())
        decision = decide(job, pods, now, expected)
        try:
            for action in decision.actions:
                await self._act(key, body, job, action)
        except ApiError as error:
            if job.spec.launcher == "mpi" and error.status == 404:
                refusal = MPI_OPERATOR_MISSING
            elif error.status in REFUSED:
                # The API server refuses what the spec builds (a field the schema leaves free).
                refusal = error.message
            else:
                raise
            await self._apply(key, body, status, reject(status, [refusal], now))
            return
        await self._apply(key, body, status, decision)

    async def reconcile_or_retry(self, key: Key) -> None:
        """Reconcile; on an error, log it, count it and try again with a growing delay."""
        try:
            await self.reconcile(key)
        except Exception as error:
            failures = self.failures[key] = self.failures.get(key, 0) + 1
            delay = min(0.5 * 2**failures, 60.0)
            metrics.RECONCILE_ERRORS.inc()
            log.warning("reconciling %s/%s failed (%s); retrying in %.1fs", *key, error, delay)
            self.queue.add(key, after=delay)
        else:
            self.failures.pop(key, None)

    async def _act(
        self, key: Key, body: dict[str, Any], job: DDPTrainingJob, action: Action
    ) -> None:
        namespace, name = key
        if isinstance(action, CreateWorkers):
            children = build_children(job, action.attempt, self.build_settings, action.indices)
            kopf.adopt(children, owner=kopf.Body(cast(kopf.RawBody, body)))
            pods = [c for c in children if c["kind"] == "Pod"]
            others = [c for c in children if c["kind"] != "Pod"]
            self.expectations.expect(
                key, [p["metadata"]["name"] for p in pods], asyncio.get_running_loop().time()
            )
            # Pods name the ServiceAccount, which must exist before them.
            await asyncio.gather(*(self.kube.create(child) for child in others))
            await asyncio.gather(*(self.kube.create(child) for child in pods))
        elif isinstance(action, DeletePods):
            await asyncio.gather(*(self.kube.delete_pod(namespace, pod) for pod in action.names))
        elif isinstance(action, DeleteJob):
            await self.kube.delete_job(namespace, name)

    async def _apply(
        self, key: Key, body: dict[str, Any], before: JobStatus, decision: Decision
    ) -> None:
        """Write the status if it changed, post the decision's events, schedule timed rules."""
        namespace, name = key
        # status.training belongs to the trainer: never write back what we read of it.
        written = decision.status.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude={"training"}
        )
        if written != before.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude={"training"}
        ):
            updated = await self.kube.patch_job_status(namespace, name, written)
            if updated is not None:
                self.jobs.offer(key, updated)
                metrics.observe_transition(body, before, decision.status)
        stamp = utcnow()
        await asyncio.gather(
            *(
                self.kube.create(build_event(body, e.type, e.reason, e.message, stamp))
                for e in decision.events
            )
        )
        if decision.requeue_after is not None:
            self.queue.add(key, after=decision.requeue_after + 0.5)


def _operator(memo: Any) -> Operator:
    operator: Operator = memo.operator
    return operator


# --- kopf wiring ---------------------------------------------------------------------------


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorConfig = memo.config
    prefix = names.GROUP
    settings.persistence.finalizer = f"{prefix}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.label_selectors["pods"] = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
    settings.scanning.disabled = True
    memo.operator = Operator(config=config, kube=Kube())
    metrics.serve(config.metrics_port, memo.operator.jobs.statuses)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    operator = _operator(memo)
    await operator.queue.close()
    await operator.kube.close()


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """The same credentials as our own calls (kopf would prefer a client library's)."""
    return load_credentials()


@kopf.index("pods", labels=OUR_PODS)
def ddp_pods(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> Any:
    """Our pods by (namespace, job name), as the status core sees them."""
    job = labels.get(names.LABEL_JOB_NAME)
    return {(namespace, job): PodView.from_pod(body)} if job else None


@kopf.on.event(names.GROUP, names.VERSION, names.PLURAL)
async def job_event(
    type: str, event: kopf.RawEvent, name: str, namespace: str | None, memo: Any, **kwargs: Any
) -> None:
    operator = _operator(memo)
    operator.pods = kwargs["ddp_pods"]
    key: Key = (namespace or "default", name)
    if type == "DELETED":
        operator.jobs.drop(key)
        operator.expectations.forget(key)
        return
    operator.jobs.offer(key, dict(event["object"]))
    operator.queue.add(key)


@kopf.on.event("pods", labels=OUR_PODS)
async def pod_event(
    name: str, namespace: str | None, labels: Mapping[str, str], memo: Any, **kwargs: Any
) -> None:
    operator = _operator(memo)
    operator.pods = kwargs["ddp_pods"]
    job = labels.get(names.LABEL_JOB_NAME)
    if job and namespace:
        key = (namespace, job)
        operator.expectations.observe(key, name)
        operator.queue.add_batched(key, POD_EVENT_WINDOW)
