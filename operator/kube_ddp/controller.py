"""The reconcile loop: read a job and its pods, ask the status core, apply what it decides.

No decision is made here (they are all in `status.decide`), and nothing here knows kopf but
`kopf.adopt`: the kopf wiring in `handlers.py` feeds the job cache and the pod index and
queues keys; `Controller.reconcile` does the rest. Its in-memory state:

- `jobs` (JobCache): the newest body of each job, so a stale watch event cannot repeat a
  decision (a second group restart);
- `expectations`: pods created but not yet seen in the watch, which count as Pending;
- `queue` (WorkQueue): one reconcile at a time per job, failed ones retried with backoff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import ValidationError

from kube_ddp import gang, kueue, metrics, names, operator_policy
from kube_ddp.api import DDPTrainingJob, JobStatus, load_job
from kube_ddp.builders import BuildSettings, build_event, job_labels
from kube_ddp.config import OperatorConfig
from kube_ddp.jobfile import describe_errors
from kube_ddp.kube import (
    ApiError,
    Kube,
    NameTakenError,
    NotFoundError,
    RefusedError,
    job_path,
    workload_path,
)
from kube_ddp.launchers import Launcher, build_children, kueue_pods, launcher_of
from kube_ddp.launchers.mpi import build_mpijob, mpi_admission_probes, mpijob_placement
from kube_ddp.reasons import Reason
from kube_ddp.status import (
    KIND_LOOK_SECONDS,
    UNDER_WAY,
    Action,
    CreateWorkers,
    Decision,
    DeleteJob,
    DeleteMPIJob,
    DeletePods,
    MPIJobView,
    PodView,
    Refusal,
    SuspendMPIJob,
    classify,
    decide,
    most_decisive,
    mount_look_due,
    node_lost,
    refuse,
    reject,
    wait_for_kind,
)
from kube_ddp.status.draft import set_condition
from kube_ddp.status.trust import (
    REPORTED_KEYS,
    ignored_message,
    overwritten_message,
    owned_fields,
    read_status,
    restore_owned,
)
from kube_ddp.workqueue import WorkQueue

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, job name)
PodIndex = Mapping[Key, Iterable[PodView]]
# kopf watches the MPIJob kind once its CRD is there (handlers.configure): until then a
# launcher mpi job could not be followed, and waits.
MPI_OPERATOR_MISSING = (
    f"launcher mpi needs the MPI Operator ({names.MPIJOB_API_VERSION} {names.MPIJOB_KIND}), "
    "whose kind this cluster does not serve: the job waits until it does (install the MPI "
    "Operator), or use launcher: torchrun"
)
# Children that need no other to exist: created first, together (see `Controller._act`).
FIRST_ROUND_KINDS = frozenset(
    {"Service", names.NETWORK_POLICY_KIND, "ServiceAccount", "Role", "PodGroup"}
)
FIRST_RETRY_DELAY = 1.0  # seconds; doubled after each failed reconcile of the same job
MAX_RETRY_DELAY = 60.0


class KindNotServedError(Exception):
    """A child's kind is not served by this cluster (a gang's PodGroup): the job cannot run."""


class ChildrenRefusedError(Exception):
    """The API server refused children of one `CreateWorkers` (`refusal`, the decisive one);
    `pods` are the worker pods that were created before or in the same round."""

    def __init__(self, refusal: Refusal, pods: tuple[str, ...]) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal
        self.pods = pods


class WaitingForRoomError(Exception):
    """A refusal that waits (a full quota) holds the job; its status says so. Retried with
    the same backoff as an error, and no event of its own pods creates the group sooner."""


# How long an answer of the API server's discovery (is a gang's PodGroup kind served) is kept:
# a scheduler installed meanwhile is found for jobs made after it.
SERVED_TTL_SECONDS = 60.0


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


# A reconcile failing this many times in a row says so on the job, with the error's first line
# cut at ERROR_LINE_LENGTH characters.
FAILURES_SAID = 3
ERROR_LINE_LENGTH = 300


def retry_delay(failures: int) -> float:
    """Seconds before the next try after `failures` failed reconciles in a row."""
    return float(min(FIRST_RETRY_DELAY * 2 ** (failures - 1), MAX_RETRY_DELAY))


# The job (its uid) and the attempt a pod was made for.
MadeFor = tuple[str | None, int | None]


@dataclass
class _Expected:
    deadline: float
    made_for: MadeFor = (None, None)
    uid: str | None = None  # what it was created as, once its create has returned


@dataclass
class Expectations:
    """Pods we created that the watch has not shown yet (Kubernetes' "expectations")."""

    timeout: float
    _pending: dict[Key, dict[str, _Expected]] = field(default_factory=dict)

    def expect(
        self, key: Key, pod_names: Iterable[str], now: float, made_for: MadeFor = (None, None)
    ) -> None:
        pending = self._pending.setdefault(key, {})
        pending.update((name, _Expected(now + self.timeout, made_for)) for name in pod_names)

    def created(self, key: Key, pod_name: str, uid: str) -> None:
        if (expected := self._pending.get(key, {}).get(pod_name)) is not None:
            expected.uid = uid

    def observe(self, key: Key, pod_name: str, pod: PodView | None = None) -> None:
        """An event of `pod_name` (`pod`, as the event shows it), or None: it will never be
        seen (its create failed). An event ends the wait only if it is of the very pod
        created: its uid once the create has returned, before that the job and attempt it was
        made for. An earlier pod of that name (the last attempt's, or an earlier job's of the
        same name), whose last events kopf may read after the new pod's (a queue per
        object), ends no wait: the new pod would read as vanished."""
        expected = self._pending.get(key, {}).get(pod_name)
        if expected is None:
            return
        if pod is not None:
            if expected.uid is not None:
                ours = pod.uid == expected.uid
            else:
                ours = (pod.owner_uid, pod.attempt) == expected.made_for
            if not ours:
                return
        del self._pending[key][pod_name]

    def pending(self, key: Key, now: float) -> list[str]:
        waiting = {n: e for n, e in self._pending.get(key, {}).items() if e.deadline > now}
        self._pending[key] = waiting
        return list(waiting)

    def forget(self, key: Key) -> None:
        self._pending.pop(key, None)


def _resource_version(body: Mapping[str, Any]) -> int:
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
            self._bodies[key] = _without_managed_fields(body)

    def get(self, key: Key) -> dict[str, Any] | None:
        return self._bodies.get(key)

    def drop(self, key: Key) -> None:
        self._bodies.pop(key, None)

    def bodies(self) -> list[dict[str, Any]]:
        return list(self._bodies.values())


def _without_managed_fields(body: dict[str, Any]) -> dict[str, Any]:
    """`body` less metadata.managedFields, which nothing here reads: the API server's record
    of who set which field, most of a job's objects once its status has been written."""
    metadata = body.get("metadata") or {}
    if "managedFields" not in metadata:
        return body
    kept = {name: value for name, value in metadata.items() if name != "managedFields"}
    return {**body, "metadata": kept}


@dataclass
class Controller:
    """The operator's reconcile loop and the state it keeps between reconciles."""

    config: OperatorConfig
    kube: Kube
    # Our pods by job, as the status core sees them: the kopf index, once a handler has run.
    pods: PodIndex | None = None
    # launcher mpi: the MPI Operator's launcher and worker pods by job (a kopf index too), and
    # our MPIJobs as last seen.
    mpi_pods: PodIndex | None = None
    mpijobs: dict[Key, MPIJobView] = field(default_factory=dict)
    jobs: JobCache = field(default_factory=JobCache)
    expectations: Expectations = field(init=False)
    queue: WorkQueue[Key] = field(init=False)
    failures: dict[Key, int] = field(default_factory=dict)  # failed reconciles in a row
    # Whether kopf watches MPIJobs: it looks up the kinds it watches once, when it starts.
    watches_mpijobs: Callable[[], bool] = lambda: True
    watches_workloads: Callable[[], bool] = lambda: True  # Kueue's, the same way
    # kopf's look at one API group's kinds again (kopf_insights.rediscoverer), for a job that
    # waits for a kind; when each group was last looked at (loop time).
    rediscover: Callable[[str], Awaitable[None]] | None = None
    rediscovered_at: dict[str, float] = field(default_factory=dict)
    synced: set[Key] = field(default_factory=set)  # reconciled since we started
    # Jobs waiting for room (`WaitingForRoomError`): no group is created before this loop time,
    # whatever events arrive (deleting the refused group's pods makes a burst of them).
    held_until: dict[Key, float] = field(default_factory=dict)
    # Workers deleted just after they exited with the preempted code (a drain's eviction: the
    # kubelet removes the pod once its container ended), removed while they still ran (a
    # deletion its node agent confirmed at once), or after their node was taken for lost
    # (evicted from a node that stopped reporting, then removed by whatever answers for it),
    # kept for the next reconcile, which may run after both events: gone from the index, the
    # worker would read as vanished, and its failure say less than its last look did.
    last_words: dict[Key, dict[str, PodView]] = field(default_factory=dict)
    # Gang PodGroup apiVersions: whether served, and the loop time it was asked (`_served`).
    served_cache: dict[str, tuple[bool, float]] = field(default_factory=dict)
    # The status each job was last decided to have, with the job's uid and the resourceVersion
    # it holds from: its fields of the operator's own that differ in a newer body were written
    # by someone else (status/trust.py).
    decided: dict[Key, tuple[str | None, int, JobStatus]] = field(default_factory=dict)
    # Per job: the status fields ignored and said so (once while they stay not valid),
    # and the values of its own fields it could not read, which its next write replaces.
    ignored_said: dict[Key, set[str]] = field(default_factory=dict)
    unreadable: dict[Key, dict[str, Any]] = field(default_factory=dict)
    # The first line of the error a failing reconcile last said on the job (`_say_failing`).
    failing_said: dict[Key, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.expectations = Expectations(self.config.expectation_timeout)
        self.queue = WorkQueue(self.reconcile_or_retry, workers=self.config.workers)

    @property
    def build_settings(self) -> BuildSettings:
        return BuildSettings(
            trainer_image=self.config.trainer_image, network_policy=self.config.network_policy
        )

    # --- what the kopf handlers tell us --------------------------------------------------

    def job_changed(self, key: Key, body: dict[str, Any]) -> None:
        self.jobs.offer(key, body)
        self.queue.add(key)

    def job_deleted(self, key: Key, uid: str | None) -> None:
        """The job of `uid` is gone. kopf keeps a queue per object, so this may be read after a
        new job of the same name made its pods: what is kept of that one stays."""
        known = self.jobs.get(key)
        if known is not None and uid is not None and known["metadata"].get("uid") != uid:
            return
        self.jobs.drop(key)
        self.mpijobs.pop(key, None)
        self.expectations.forget(key)
        self.failures.pop(key, None)
        self.synced.discard(key)
        self.held_until.pop(key, None)
        self.last_words.pop(key, None)
        self.decided.pop(key, None)
        self.ignored_said.pop(key, None)
        self.unreadable.pop(key, None)
        self.failing_said.pop(key, None)

    def pod_deleted(self, key: Key, pod: PodView) -> None:
        preempted = pod.phase == "Failed" and pod.exit_code == names.EXIT_PREEMPTED
        removed_running = pod.deleting and pod.phase == "Running"
        if preempted or removed_running or node_lost(pod) is not None:
            self.last_words.setdefault(key, {})[pod.name] = pod

    def pod_changed(self, key: Key, pod: PodView, window: float) -> None:
        """An event of one of the job's pods."""
        self.expectations.observe(key, pod.name, pod)
        self.queue.add_batched(key, window)

    def mpijob_changed(self, key: Key, mpijob: MPIJobView | None, window: float) -> None:
        """An MPIJob event; None when it was deleted."""
        if mpijob is None:
            self.mpijobs.pop(key, None)
        else:
            self.mpijobs[key] = mpijob
            self.expectations.observe(key, mpijob.name)
        self.queue.add_batched(key, window)

    # --- reconcile ---------------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        body = self.jobs.get(key)
        if body is None:
            return
        now = utcnow()
        body, read = await self._readable(key, body)
        body, status, overwritten = self._trusted(key, body, read)
        await self._say_overwritten(key, body, overwritten)
        try:
            job = load_job(body)
        except ValidationError as error:
            await self._apply(key, body, read, reject(status, describe_errors(error), now))
            return
        launcher = launcher_of(job)
        if not self._watches(launcher) and not await self._watched_after_a_look(
            names.MPIJOB_API_VERSION.split("/")[0], lambda: self._watches(launcher)
        ):
            await self._apply(key, body, read, wait_for_kind(status, MPI_OPERATOR_MISSING, now))
            return
        resolved = gang.resolve(job, await self._served(gang.candidates(job)))
        if isinstance(resolved, str):
            await self._apply(key, body, read, wait_for_kind(status, resolved, now))
            return
        job = resolved
        index = {"ddp_pods": self.pods, "mpi_pods": self.mpi_pods}[launcher.pod_index]
        pods = list(index.get(key, [])) if index is not None else []
        # Said once, and only to a group under way: the decision that sees them records the
        # preemption; a group already stopped need not wait for them.
        words = self.last_words.pop(key, {})
        if status.phase in UNDER_WAY:
            seen = {p.name for p in pods}
            said = [pod for pod in words.values() if pod.name not in seen]
            pods += said
            if said:  # they stand for pods gone: the next look, at once, sees the names free
                self.queue.add(key)
        pods = await self._with_mount_failures(key[0], pods, now)
        expected = self.expectations.pending(key, asyncio.get_running_loop().time())
        body, job, queued = await self._apply_kueue(key, body, job, pods)
        if (held := _held_by_the_queue(status, queued, now)) is not None:
            await self._apply(key, body, read, held)
            return
        decision = decide(job, pods, now, expected, self.mpijobs.get(key), queued.suspended)
        if self._held(key, decision):
            return  # the scheduled retry creates the group
        try:
            for action in decision.actions:
                await self._act(key, body, job, action)
        except NotFoundError:
            if names.MPIJOB_KIND not in launcher.kinds:
                raise  # a namespace being deleted, say: retried like any error
            await self._apply(key, body, read, wait_for_kind(status, MPI_OPERATOR_MISSING, now))
            return
        except ChildrenRefusedError as refused:
            ours = [p.name for p in pods] if launcher.owns_pods else []
            decision = refuse(status, refused.refusal, [*ours, *refused.pods], now)
            for action in decision.actions:
                if isinstance(action, DeletePods):  # gone, so never expected
                    for pod_name in action.names:
                        self.expectations.observe(key, pod_name)
                await self._act(key, body, job, action)
            await self._apply(key, body, read, decision)
            if refused.refusal.verdict == "wait":
                raise WaitingForRoomError(refused.refusal.message) from None
            return
        self.held_until.pop(key, None)
        await self._apply(key, body, read, decision)

    async def _readable(self, key: Key, body: dict[str, Any]) -> tuple[dict[str, Any], JobStatus]:
        """`body` less the status fields that are not valid, and its status: those fields are
        said once on the job; the operator's own are written again at its next write."""
        raw = body.get("status")
        read, dropped = read_status(raw)
        if not dropped:
            self.ignored_said.pop(key, None)
            self.unreadable.pop(key, None)
            return body, read
        stored = raw if isinstance(raw, Mapping) else {}
        self.unreadable[key] = {
            k: stored[k] for k in dropped if k in stored and k not in REPORTED_KEYS
        }
        said = self.ignored_said.get(key, set()) & dropped.keys()
        self.ignored_said[key] = said | dropped.keys()
        if new := {k: why for k, why in dropped.items() if k not in said}:
            message = ignored_message(new)
            log.warning("%s/%s: %s", *key, message)
            event = build_event(body, "Warning", Reason.STATUS_IGNORED, message, utcnow())
            await self.kube.create(event)
        status = read.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {**body, "status": status}, read

    def _trusted(
        self, key: Key, body: dict[str, Any], read: JobStatus
    ) -> tuple[dict[str, Any], JobStatus, list[str]]:
        """`body` and its status (`read`) with the fields the operator owns as it last decided
        them, and the fields someone else changed since (status/trust.py)."""
        known = self.decided.get(key)
        if known is None:
            return body, read, []
        uid, version, decided = known
        if uid != body["metadata"].get("uid") or _resource_version(body) < version:
            return body, read, []
        status, changed = restore_owned(read, decided)
        if not changed:
            return body, read, []
        restored = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {**body, "status": restored}, status, changed

    async def _say_overwritten(self, key: Key, body: dict[str, Any], changed: list[str]) -> None:
        if not changed:
            return
        message = overwritten_message(changed)
        log.warning("%s/%s: %s", *key, message)
        event = build_event(body, "Warning", Reason.STATUS_OVERWRITTEN, message, utcnow())
        await self.kube.create(event)

    async def _watched_after_a_look(self, group: str, watched: Callable[[], bool]) -> bool:
        """Whether kopf watches a kind, after asking it to look at `group`'s kinds again where
        it does not (at most every KIND_LOOK_SECONDS a group): kopf scans kinds once,
        at its start."""
        if watched():
            return True
        now = asyncio.get_running_loop().time()
        looked = self.rediscovered_at.get(group, float("-inf"))
        if self.rediscover is None or now - looked < KIND_LOOK_SECONDS:
            return False
        self.rediscovered_at[group] = now
        try:
            await self.rediscover(group)
        except Exception as error:  # discovery failing is a reason to wait, not to fail
            log.warning("looking at the kinds of %s again failed: %s", group, error)
            return False
        return watched()

    def _watches(self, launcher: Launcher) -> bool:
        """Whether kopf watches the kinds of `launcher`'s children (it looks them up once)."""
        return names.MPIJOB_KIND not in launcher.kinds or self.watches_mpijobs()

    async def _served(self, candidates: Iterable[str]) -> set[str]:
        """The PodGroup apiVersions of `candidates` (gang schedulers) this cluster serves,
        each asked at most once a SERVED_TTL_SECONDS."""
        now = asyncio.get_running_loop().time()
        found = set()
        for scheduler in candidates:
            api_version = gang.KINDS[scheduler].api_version
            served, asked = self.served_cache.get(api_version, (False, -math.inf))
            if now - asked > SERVED_TTL_SECONDS:
                served = await self.kube.serves(api_version)
                self.served_cache[api_version] = (served, now)
            if served:
                found.add(api_version)
        return found

    async def _with_mount_failures(
        self, namespace: str, pods: list[PodView], now: datetime
    ) -> list[PodView]:
        """`pods`, each still creating its containers past its time with the kubelet's newest
        FailedMount Event: a volume it cannot mount is said nowhere in the pod."""

        async def looked(pod: PodView) -> PodView:
            if pod.uid is None or not mount_look_due(pod, now):
                return pod
            said = await self.kube.newest_event_message(namespace, pod.uid, "FailedMount")
            return dataclasses.replace(pod, cannot_mount=said) if said else pod

        return list(await asyncio.gather(*(looked(pod) for pod in pods)))

    def _held(self, key: Key, decision: Decision) -> bool:
        """Whether `decision` would create a group while the job waits for room."""
        until = self.held_until.get(key)
        creates = any(isinstance(a, CreateWorkers) for a in decision.actions)
        return creates and until is not None and asyncio.get_running_loop().time() < until

    async def _apply_kueue(
        self, key: Key, body: dict[str, Any], job: DDPTrainingJob, pods: list[PodView]
    ) -> tuple[dict[str, Any], DDPTrainingJob, kueue.Step]:
        """Kueue's contract for a job labelled with a queue (`kueue.plan` decides): the job as
        it is afterwards, and the step taken (why a queue holds the job suspended)."""
        if kueue.queue_name(job) is None:
            return body, job, kueue.Step(refused=kueue.unqueued_refusal(job))
        if not await self._watched_after_a_look(kueue.GROUP, self.watches_workloads):
            return body, job, kueue.Step(waiting=kueue.NOT_SERVED)  # no admission would reach us
        workload = await self.kube.get(workload_path(job.namespace, kueue.workload_name(job)))
        flavors = {}
        if kueue.is_admitted(workload) and job.spec.run_policy.suspend:
            for flavor in kueue.all_assigned_flavors(workload):
                flavors[flavor] = await self.kube.get(kueue.flavor_path(flavor)) or {}
        step = kueue.plan(job, workload, flavors, any(p.active for p in pods), utcnow())
        if step.job_patch is not None:
            updated = await self.kube.patch(job_path(*key), step.job_patch)
            if updated is not None:
                self.jobs.offer(key, updated)
                body, read = await self._readable(key, updated)
                body, _, _ = self._trusted(key, body, read)
                job = load_job(body)
        if step.create_workload:
            priority = None
            if (ref := kueue.priority_class(job)) is not None:
                priority = (await self.kube.get(kueue.priority_class_path(ref)) or {}).get("value")
            shapes = kueue_pods(job, self.build_settings)
            created = kueue.build_workload(job, shapes, job_labels(job), priority)
            kopf.adopt(created, owner=kopf.Body(cast(kopf.RawBody, body)))
            try:
                await self.kube.create(created)
            except NotFoundError:  # the kind is not served (a namespace gone takes the job too)
                return body, job, kueue.Step(waiting=kueue.NOT_SERVED)
            except RefusedError as error:  # Kueue's webhook, say: no such priority class
                return body, job, kueue.Step(refused=error.message)
        if step.workload_status is not None and workload is not None:
            name = workload["metadata"]["name"]
            await self.kube.patch(
                workload_path(job.namespace, name) + "/status", step.workload_status
            )
        return body, job, step

    async def reconcile_or_retry(self, key: Key) -> None:
        """Reconcile; on an error, log it, count it and try again with a growing delay."""
        try:
            with metrics.RECONCILE_DURATION.time():
                await self.reconcile(key)
        except WaitingForRoomError as waiting:
            failures = self.failures[key] = self.failures.get(key, 0) + 1
            delay = retry_delay(failures)
            self.held_until[key] = asyncio.get_running_loop().time() + delay
            log.info("%s/%s: %s; trying again in %.1fs", *key, waiting, delay)
            self.queue.add(key, after=delay)
        except Exception as error:
            failures = self.failures[key] = self.failures.get(key, 0) + 1
            delay = retry_delay(failures)
            metrics.RECONCILE_ERRORS.inc()
            log.warning("reconciling %s/%s failed (%s); retrying in %.1fs", *key, error, delay)
            self.queue.add(key, after=delay)
            if failures >= FAILURES_SAID:
                await self._say_failing(key, error, failures, delay)
        else:
            if key not in self.held_until:  # a held reconcile keeps the backoff growing
                self.failures.pop(key, None)
            if self.failing_said.pop(key, None) is not None:
                await self._set_failing_condition(key, None)
            if key not in self.synced:
                self.synced.add(key)
                metrics.JOBS_SYNCED.inc()

    async def _say_failing(self, key: Key, error: Exception, failures: int, delay: float) -> None:
        """A Warning on the job once its reconcile has failed the same way FAILURES_SAID times
        in a row (again when the error changes): a retry loop is never silent."""
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        first_line = first_line[:ERROR_LINE_LENGTH]
        body = self.jobs.get(key)
        if body is None or self.failing_said.get(key) == first_line:
            return
        self.failing_said[key] = first_line
        message = (
            f"reconciling this job failed {failures} times in a row, the last with: "
            f"{first_line}; retrying every {delay:.0f}s at most"
        )
        try:
            await self.kube.create(
                build_event(body, "Warning", Reason.RECONCILE_FAILING, message, utcnow())
            )
        except Exception as failed:  # the API server may be what fails: the log still says it
            log.warning("%s/%s: could not post %s: %s", *key, Reason.RECONCILE_FAILING, failed)
        await self._set_failing_condition(key, message)

    async def _set_failing_condition(self, key: Key, message: str | None) -> None:
        """The job's ReconcileFailing condition: True with `message` while its reconcile
        fails, False (None) once one succeeds again. Written as the operator's own, so the
        record of what it decided (`decided`, status/trust.py) holds it too; a write that
        fails is logged, the Event and the log having said the rest."""
        body = self.jobs.get(key)
        if body is None:
            return
        known = self.decided.get(key)
        base = known[2] if known is not None else read_status(body.get("status"))[0]
        conditions = set_condition(
            base.conditions,
            "ReconcileFailing",
            "True" if message is not None else "False",
            Reason.RECONCILE_FAILING if message is not None else Reason.RECONCILED,
            message if message is not None else "the last reconcile succeeded",
            utcnow(),
        )
        written = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]
        try:
            updated = await self.kube.patch_job_status(*key, {"conditions": written})
        except Exception as failed:
            log.warning("%s/%s: could not set ReconcileFailing: %s", *key, failed)
            return
        if updated is None:
            return
        self.jobs.offer(key, updated)
        if known is not None:
            status = known[2].model_copy(update={"conditions": conditions})
            self.decided[key] = (known[0], _resource_version(updated), status)

    async def _act(
        self, key: Key, body: dict[str, Any], job: DDPTrainingJob, action: Action
    ) -> None:
        namespace, name = key
        if isinstance(action, CreateWorkers):
            children = build_children(
                job,
                action.attempt,
                self.build_settings,
                action.indices,
                action.pod_names,
                action.avoid_nodes,
            )
            if refused := operator_policy.refusal(job, children, self.config.pod_policy):
                raise ChildrenRefusedError(Refusal("fail", *refused), ())
            kopf.adopt(children, owner=kopf.Body(cast(kopf.RawBody, body)))
            pods = [c for c in children if c["kind"] == "Pod"]
            others = [c for c in children if c["kind"] != "Pod"]
            # Two rounds, each at once: pods (and an MPIJob's) name the ServiceAccount and the
            # PodGroup, and the RoleBinding its Role, which must exist first (without `bind`,
            # the API server checks the binder against the Role's rules, so an operator with
            # least privilege gets a 404 otherwise), and the NetworkPolicy guards the pods from
            # their start; then the rest. Fewer round trips per job than one child after
            # another. A refused round raises `ChildrenRefusedError` (`_raise_refusal`).
            first = [c for c in others if c["kind"] in FIRST_ROUND_KINDS]
            then = [c for c in others if c["kind"] not in FIRST_ROUND_KINDS]
            done = await asyncio.gather(
                *(self._create_child(job, child) for child in first), return_exceptions=True
            )
            _raise_refusal(done, ())
            mpijobs = [c for c in then if c["kind"] == names.MPIJOB_KIND]
            if mpijobs:  # the pods the MPI Operator will create, asked about first
                probes = mpi_admission_probes(mpijobs[0])
                asked = await asyncio.gather(
                    *(self.kube.create(p, dry_run=True) for p in probes), return_exceptions=True
                )
                _raise_refusal(asked, ())
                # expected from before its create until the watch shows it
                self.expectations.expect(key, [job.name], asyncio.get_running_loop().time())
            done, by_pod = await asyncio.gather(
                asyncio.gather(
                    *(self._create_child(job, child) for child in then), return_exceptions=True
                ),
                self._create_pods(key, pods),
            )
            created = tuple(n for n, error in by_pod.items() if error is None)
            _raise_refusal([*done, *by_pod.values()], created)
        elif isinstance(action, DeletePods):
            await asyncio.gather(
                *(
                    self.kube.delete_pod(namespace, pod, action.force, action.grace_seconds, uid)
                    for pod, uid in action.targets()
                )
            )
        elif isinstance(action, DeleteJob):
            await self.kube.delete_job(namespace, name)
        elif isinstance(action, DeleteMPIJob):
            await self.kube.delete_mpijob(namespace, action.name)
        elif isinstance(action, SuspendMPIJob):
            # Resumed with the job's placement now (a queued job's admitted flavors).
            placement = []
            if not action.suspend:  # built only to resume
                placement = mpijob_placement(build_mpijob(job, 0, self.build_settings))
            await self.kube.suspend_mpijob(namespace, action.name, action.suspend, placement)

    async def _create_child(self, job: DDPTrainingJob, child: dict[str, Any]) -> None:
        try:
            await self.kube.create(child)
        except NotFoundError as error:
            if child["kind"] != "PodGroup":
                raise
            raise KindNotServedError(gang.not_served(job)) from error

    async def _create_pods(
        self, key: Key, pods: list[dict[str, Any]]
    ) -> dict[str, BaseException | None]:
        """Create `pods`, expected from before the first request (the watch may show one
        before its create returns); a pod whose create failed is not expected. Each pod's
        error, None where it exists now."""
        pod_names = [p["metadata"]["name"] for p in pods]
        now = asyncio.get_running_loop().time()
        for made in map(PodView.from_pod, pods):
            self.expectations.expect(key, [made.name], now, (made.owner_uid, made.attempt))
        results = await asyncio.gather(*(self.kube.create(p) for p in pods), return_exceptions=True)
        errors: dict[str, BaseException | None] = {}
        for pod_name, result in zip(pod_names, results, strict=True):
            errors[pod_name] = result if isinstance(result, BaseException) else None
            if isinstance(result, BaseException):
                self.expectations.observe(key, pod_name)
            elif result is not None:
                self.expectations.created(key, pod_name, result["metadata"]["uid"])
        return errors

    async def _apply(
        self, key: Key, body: dict[str, Any], before: JobStatus, decision: Decision
    ) -> None:
        """Write the status if it changed, post the decision's events, schedule timed rules."""
        namespace, name = key
        written = owned_fields(decision.status)
        known = owned_fields(before) | self.unreadable.get(key, {})
        uid = body["metadata"].get("uid")
        if written != known:
            patch = _merge_patch(known, written)
            # a write whose answer is lost may still land: no record is better than an old one
            self.decided.pop(key, None)
            updated = await self.kube.patch_job_status(namespace, name, patch)
            if updated is not None:
                self.jobs.offer(key, updated)
                self.decided[key] = (uid, _resource_version(updated), decision.status)
                metrics.observe_transition(body, before, decision.status)
        else:
            self.decided[key] = (uid, _resource_version(body), decision.status)
        stamp = utcnow()
        for e in decision.events:  # the operator's log tells the story its Events tell
            log.info("%s/%s: %s %s: %s", namespace, name, e.type, e.reason, e.message)
        await asyncio.gather(
            *(
                self.kube.create(build_event(body, e.type, e.reason, e.message, stamp))
                for e in decision.events
            )
        )
        if decision.requeue_after is not None:
            self.queue.add(key, after=decision.requeue_after + 0.5)


def _raise_refusal(results: Iterable[object], pods: tuple[str, ...]) -> None:
    """After one round of creates (`results`, exceptions among them): raise `ChildrenRefusedError`
    for the decisive refusal, or the first error to retry as it is (a 500, a timeout, a 404)."""
    errors = [r for r in results if isinstance(r, BaseException)]
    if not errors:
        return
    refusals: list[Refusal] = []
    for error in errors:
        if isinstance(error, KindNotServedError):  # a gang's scheduler not (yet) installed
            refusals.append(Refusal("wait", Reason.KIND_NOT_SERVED, str(error)))
        elif isinstance(error, NameTakenError):
            refusals.append(
                Refusal("wait" if error.passing else "fail", Reason.NAME_TAKEN, str(error))
            )
        elif isinstance(error, ApiError):
            refusals.append(classify(error.status, error.message))
        else:
            raise error
    decisive = most_decisive(refusals)
    if decisive.verdict == "retry":
        raise errors[refusals.index(decisive)]
    raise ChildrenRefusedError(decisive, pods)


def _held_by_the_queue(status: JobStatus, step: kueue.Step, now: datetime) -> Decision | None:
    """What a queued job that cannot go on becomes: Failed where it cannot be queued as
    written, waiting where Kueue is not served yet; None where it goes on."""
    if step.refused is not None:
        return reject(status, [step.refused], now)
    if step.waiting is not None:
        return wait_for_kind(status, step.waiting, now)
    return None


def _merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch (RFC 7386) that turns `before` into `after`: a field `after` lacks is
    null, removed (else a new status.failure would keep the last one's node or exit code)."""
    patch: dict[str, Any] = dict.fromkeys(before.keys() - after.keys())
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            patch[key] = _merge_patch(old, value)
        else:
            patch[key] = value
    return patch
