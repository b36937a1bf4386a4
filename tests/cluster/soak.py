"""The soak on kwok: many jobs at once, the faults kube-ddp claims to survive injected at random
times from a seed, and invariants checked continuously and at the end.

The faults are drawn before the soak starts (`plan`): the same seed gives the same faults at the
same times, on the same jobs and workers. What a fault meets depends on timing, so each is
recorded with the job's state as it was applied (`Hit`), and the counting invariants compare the
job's `restarts` and `preemptions` with the faults that reached it: never more than the faults
that hit a live pod (no phantom restart), never fewer than the isolated ones (no fault lost):
those that met a steady job, no other fault of the job near them and no operator outage (a
leader's kill, an API server's restart) under way or begun just after. Faults per job: a worker
killed (exit 137), its pod deleted, its pod evicted through the Eviction API, rank 0 gone quiet (a
hang: no progress report), a suspend and resume by the user, a Kueue preemption, a forged
status sent with the job's worker token and an impostor pod labelled as its worker 0, made by the
admin (whom the pod policy lets pass, as a cluster without it would) or by a tenant of the
namespace (whom it must refuse); neither may change anything: no restart, no end, no pod past
the job's nodes; for many jobs
at once: a node that stops reporting and comes back, the leading operator killed (two replicas
with leader election), the API server restarted. Some faults come with a second one on the same
job seconds later: two at a time, and during a recovery.

Every `QUEUED_EVERY`th slot's jobs queue in real Kueue (hack/devcluster/kueue.py), each slot in
a ClusterQueue of its own that its job fills: a preemption is a higher-priority job created in
that queue (Kueue evicts the slot's job, runs the other, readmits it); the user's suspend of a
queued job is its Workload's `spec.active: false`, as Kueue has its users stop one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from ddp_trainer.report import position_fields, training_patch
from kube_ddp import kueue, names, pod_policy, status_policy
from kube_ddp.api import load_job
from tests.cluster.operator_support import (
    SIM_EXIT_CODE,
    TENANT,
    Jobs,
    OperatorProcess,
    admission_policy_in,
    core_as,
    job_manifest,
    make_tenant,
    service_account_token,
)
from tests.cluster.support import Cluster, load_dev_cluster

JOB_FAULTS = ("kill", "delete", "evict", "hang", "suspend", "preempt", "forge", "impostor")
# Faults that must change nothing (docs/security.md): a status of the operator's fields sent
# with the token every worker holds, and an ownerless pod labelled as the job's worker 0.
PROBES = ("forge", "impostor")
CLUSTER_FAULTS = ("node", "leader", "apiserver")
# How each fault on a steady job is counted (design.md, "Failure rules", "Preemption"): a pod
# deleted or evicted while its container runs is replaced alone and not counted where the ranks
# restart in place and it is not worker 0; otherwise its group restarts.
RESTART, PREEMPTION = "restart", "preemption"
LIVE = ("Pending", "Running")
UNDER_WAY = ("Pending", "Starting", "Running", "Restarting")
PROGRESS_DEADLINE = 60  # the schema's least
REPORT_EVERY = 8.0
TERMINATING_AT_MOST = 90.0  # a worker's grace period (30 s) and the operator's force delete
QUIET_AROUND = 30.0  # a fault is isolated when no other reached its job this close
AT_ONCE = 5.0  # faults this close may reach the operator's same decision
# From a leader's kill or an API server's restart (which ignores SIGTERM for 15 s, then the
# leader exits on its renew deadline) until a new leader acts: 35 s at most seen.
OPERATOR_AWAY = 40.0
NODE_QUIET_AROUND = 120.0
# A hang restarts its group at the progress deadline: a fault before then meets it still hung.
HANG_QUIET_AROUND = PROGRESS_DEADLINE + QUIET_AROUND
NODE_SILENT_SECONDS = (60.0, 90.0)
SUSPENDED_SECONDS = 5.0
FINISH_AGAIN_AFTER = 20.0
RSS_FROM = 60.0
QUEUED_EVERY = 4  # slots 0, 4, 8...: a preemption is aimed at the queued slot at or below
QUEUE_CPU = 3  # a queued job's workers ask 1 cpu each, 3 at most; its preemptor all of them
PREEMPTOR_PRIORITY = 1000
PREEMPTOR_WORKS = 5.0
LEASE = (4.0, 3.0, 1.0)  # duration, renew deadline, retry period: a takeover in seconds
KUBELET_STOPPED = load_dev_cluster().pod_remover.KUBELET_STOPPED
# What a call meets while the API server restarts.
UNAVAILABLE = (
    kubernetes.client.ApiException,
    urllib3.exceptions.HTTPError,
    OSError,
)


@dataclasses.dataclass(frozen=True)
class Settings:
    seed: int
    minutes: float
    jobs: int  # at once; each is created again under its name when it ends
    nodes: int
    faults_per_minute: float
    overlap: float = 0.3  # the share of job faults that get a second one on the same job


@dataclasses.dataclass(frozen=True)
class Fault:
    at: float  # seconds from the soak's start
    kind: str
    job: int = -1  # the job's slot, for a job fault
    worker: int = 0  # which worker index (modulo the job's nodes)
    node: int = 0  # which soak node, for a node fault


def aimed(job: int, kind: str) -> int:
    """The slot a fault reaches: a preemption only reaches a queued one."""
    return job - job % QUEUED_EVERY if kind == "preempt" else job


def plan(settings: Settings) -> list[Fault]:
    """Every fault of the soak, drawn from its seed alone."""
    draw = random.Random(settings.seed)
    faults: list[Fault] = []
    clock = 10.0  # the jobs' first pods run first
    end = settings.minutes * 60
    rate = settings.faults_per_minute / 60
    # Each cluster fault comes once per ~3 minutes of soak, at least once.
    for kind in CLUSTER_FAULTS:
        for n in range(max(1, round(settings.minutes / 3))):
            window = end / max(1, round(settings.minutes / 3))
            at = n * window + draw.uniform(0.2, 0.7) * window
            faults.append(Fault(at, kind, node=draw.randrange(settings.nodes)))
    while True:
        clock += draw.expovariate(rate)
        if clock > end - 20:
            break
        job, kind = draw.randrange(settings.jobs), draw.choice(JOB_FAULTS)
        faults.append(Fault(clock, kind, aimed(job, kind), worker=draw.randrange(8)))
        if draw.random() < settings.overlap:
            second = draw.choice(JOB_FAULTS)
            at = clock + draw.uniform(0, 4)
            faults.append(Fault(at, second, aimed(job, second), draw.randrange(8)))
    for kind in sorted(set(JOB_FAULTS) - {fault.kind for fault in faults}):  # each, once at least
        at, job = draw.uniform(10, end - 20), draw.randrange(settings.jobs)
        faults.append(Fault(at, kind, aimed(job, kind), draw.randrange(8)))
    return sorted(faults, key=lambda fault: fault.at)


def preemption_reaches(phase: str | None) -> bool:
    """Whether a preemptor made now may preempt the queued job, whatever its status says: under
    way, it holds the quota the preemptor needs; suspended (by the user, or by an earlier
    preemption), Kueue may readmit it before the preemptor's Workload is queued, and preempt it
    then. Only an upper bound: a suspended job is not steady, so nothing is expected of it."""
    return phase not in ("Succeeded", "Failed")


@dataclasses.dataclass
class Hit:
    """One fault as it reached a job: its state then, and whether it hit a live pod."""

    at: float
    kind: str
    target: str
    effective: int  # how many of the job's pods it hit (0: it met nothing to hit)
    steady: bool  # the job was Running with every current pod Running, none terminating
    expect: str  # RESTART or PREEMPTION, for a steady job
    phase: str
    attempt: int
    restarts: int
    preemptions: int

    def line(self) -> str:
        return (
            f"{self.at:7.1f}s {self.kind:<9} {self.target:<26} effective={self.effective} "
            f"steady={self.steady} expect={self.expect or '-'} phase={self.phase} "
            f"attempt={self.attempt} restarts={self.restarts} preemptions={self.preemptions}"
        )


@dataclasses.dataclass
class Generation:
    """One job object under a slot's name, from its creation to its deletion."""

    name: str
    uid: str
    spec: dict[str, Any]
    work: float  # seconds of steady running before the soak ends its workers with 0
    created: float
    hits: list[Hit] = dataclasses.field(default_factory=list)
    running_since: float | None = None
    reported: float = 0.0
    step: int = 0
    reported_attempt: tuple[int, ...] | None = None  # `group_of` the last report
    hung_at: tuple[int, ...] | None = None  # quiet while the job's group stays
    finishing: float = 0.0  # when the soak ended its workers with 0
    resume_at: float | None = None
    outcome: dict[str, Any] | None = None
    workload: str | None = None  # Kueue's, for a queued job

    @property
    def in_place(self) -> bool:
        return self.spec["runPolicy"].get("restartStrategy", "InPlace") == "InPlace"


def group_of(status: dict[str, Any]) -> tuple[int, ...]:
    """Which group of ranks runs: a restart of any kind, or a preemption's resume, starts a new
    rank 0 (the hung one is gone with its group)."""
    return tuple(int(status.get(key, 0)) for key in ("attempt", "restarts", "preemptions"))


def queued_manifest(
    name: str, slot: int, spec: dict[str, Any], priority_class: str | None = None
) -> dict[str, Any]:
    """A job in the slot's LocalQueue, its workers asking 1 cpu each (`spec` gets them too:
    the soak keeps what it created)."""
    spec["resources"] = {"requests": {"cpu": "1"}}
    manifest = job_manifest(name, **spec)
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: f"soak-{slot}"}
    if priority_class:
        manifest["metadata"]["labels"][kueue.PRIORITY_CLASS_LABEL] = priority_class
    return manifest


def kueue_object(kind: str, name: str, rest: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": kueue.API_VERSION, "kind": kind, "metadata": {"name": name}, **rest}


@dataclasses.dataclass
class Violation:
    at: float
    job: str
    what: str


class Soak:
    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        settings: Settings,
        logs: Path,
        with_kueue: bool = True,
    ) -> None:
        self.cluster = cluster
        self.with_kueue = with_kueue  # without it (it needs root), preemptions meet nothing
        self.namespace = namespace
        self.settings = settings
        self.logs = logs
        self.jobs = Jobs(cluster, namespace)
        self.draw = random.Random(settings.seed + 1)  # the jobs' shapes, apart from the faults
        self.faults = plan(settings)
        self.label = {"kubeddp.io/soak": namespace[-8:]}
        self.node_names = [f"soak-{namespace[-8:]}-{i}" for i in range(settings.nodes)]
        self.generations: dict[int, Generation] = {}
        self.ended: list[Generation] = []
        self.violations: list[Violation] = []
        self.applied: Counter[str] = Counter()
        self.overlaps = 0
        self.silent: dict[str, float] = {}  # node -> when it comes back
        self.operators: list[subprocess.Popen[bytes]] = []
        self.operator_logs: list[Path] = []
        self.to_create: set[int] = set()
        self.on_silent: set[str] = set()  # pods counted as lost with a silent node
        self.killed_operators = 0
        # When the operator was away (its leader killed, the API server restarted).
        self.operator_away: list[float] = []
        self.finished_again = 0  # ends sent again: kwok missed the first (an API server restart)
        self.lost_leadership = 0  # replicas that exited on a Lease they could not renew
        self.restarted_operators: set[int] = set()
        self.rss: list[tuple[float, int]] = []
        self.started = time.monotonic()
        self.pods: list[Any] = []
        self.statuses: dict[str, dict[str, Any]] = {}
        self.terminating_since: dict[str, float] = {}
        self.preemptors: dict[int, Generation] = {}  # by the slot they preempt
        self.preemptors_created = 0
        self.preemptor_class = f"soak-{namespace[-8:]}-preemptor"  # a WorkloadPriorityClass
        self.probed: Counter[str] = Counter()  # how each forge and impostor was met
        self.impostors: list[str] = []
        self.nodes_of: dict[str, int] = {}  # each job's spec.nodes, by uid

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> None:
        end = self.settings.minutes * 60
        pending = list(self.faults)
        make_tenant(self.cluster, self.namespace)
        with (
            self._nodes(),
            self._queues(),
            # as the chart installs them
            admission_policy_in(self.cluster, self.namespace, status_policy),
            admission_policy_in(self.cluster, self.namespace, pod_policy),
            self._operators(),
        ):
            self.started = time.monotonic()
            for slot in range(self.settings.jobs):
                self._create(slot)
            while self.now() < end:
                self._observe()
                while pending and pending[0].at <= self.now():
                    self._apply(pending.pop(0))
                for node, back in list(self.silent.items()):
                    if self.now() >= back:
                        self._node_back(node)
                self._drive(creating=True)
                self._sample_rss()
                time.sleep(0.5)
            self._settle()
            self._sample_rss()
            self._delete_all()

    def now(self) -> float:
        return time.monotonic() - self.started

    # -- the world ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _nodes(self) -> Iterator[None]:
        capacity = {"cpu": "64", "memory": "256Gi", "pods": "110"}
        for name in self.node_names:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"type": "kwok", **self.label},
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                },
                "spec": {},
                "status": {"capacity": capacity, "allocatable": capacity},
            }
            self.cluster.core.create_node(node)
        try:
            yield
        finally:
            for name in self.node_names:
                with contextlib.suppress(*UNAVAILABLE):
                    self.cluster.core.delete_node(name)

    def _queued(self, slot: int) -> bool:
        return self.with_kueue and slot % QUEUED_EVERY == 0

    @contextlib.contextmanager
    def _queues(self) -> Iterator[None]:
        """Kueue, and for each queued slot a ClusterQueue whose quota (`QUEUE_CPU`) its jobs
        hold alone, behind the LocalQueue `soak-<slot>`; taken away with Kueue after the
        soak. Before the operators: kopf looks up the kinds it watches once, as it starts."""
        if not self.with_kueue:
            yield
            return
        dev_cluster = load_dev_cluster()
        flavor = f"soak-{self.namespace[-8:]}"
        api = self.cluster.custom_objects
        with dev_cluster.kueue.running(dev_cluster.running_state()):
            create = functools.partial(api.create_cluster_custom_object, kueue.GROUP, kueue.VERSION)
            nodes = {"spec": {"nodeLabels": self.label}}
            create(kueue.RESOURCE_FLAVORS, kueue_object("ResourceFlavor", flavor, nodes))
            priority = {"value": PREEMPTOR_PRIORITY}
            create(
                kueue.PRIORITY_CLASSES,
                kueue_object("WorkloadPriorityClass", self.preemptor_class, priority),
            )
            for slot in filter(self._queued, range(self.settings.jobs)):
                quota = [
                    {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": QUEUE_CPU}]}
                ]
                spec = {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                    },
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [{"coveredResources": ["cpu"], "flavors": quota}],
                }
                queue = f"{flavor}-{slot}"
                create("clusterqueues", kueue_object("ClusterQueue", queue, {"spec": spec}))
                local = {"spec": {"clusterQueue": queue}}
                api.create_namespaced_custom_object(
                    kueue.GROUP,
                    kueue.VERSION,
                    self.namespace,
                    "localqueues",
                    kueue_object("LocalQueue", f"soak-{slot}", local),
                )
            yield

    @contextlib.contextmanager
    def _operators(self) -> Iterator[None]:
        for n in range(2):
            self._start_operator(n)
        try:
            yield
        finally:
            for process in self.operators:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in self.operators:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(15)
                if process.poll() is None:
                    process.kill()

    def _start_operator(self, n: int) -> None:
        duration, deadline, retry = LEASE
        log_path = self.logs / f"operator-{n}.log"
        replica = OperatorProcess(
            self.cluster,
            self.namespace,
            log_path,
            (
                "--leader-election",
                f"--leader-election-namespace={self.namespace}",
                "--leader-election-id=soak",
                f"--lease-duration={duration}",
                f"--renew-deadline={deadline}",
                f"--retry-period={retry}",
            ),
        )
        replica.start()
        assert replica.process is not None
        process = replica.process
        self.operators.append(process)
        self.operator_logs.append(log_path)

    def _leader(self) -> subprocess.Popen[bytes] | None:
        """The live replica that said it leads (the Lease's holder names a host, not a pid)."""
        for process, log_path in zip(self.operators, self.operator_logs, strict=True):
            if process.poll() is None and "became the leader" in log_path.read_text(
                errors="replace"
            ):
                return process
        return None

    def _sample_rss(self) -> None:
        if self.rss and self.now() - self.rss[-1][0] < 30:
            return
        total = 0
        for process in self.operators:
            if process.poll() is None:
                with contextlib.suppress(OSError):
                    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            total = max(total, int(line.split()[1]) // 1024)
        self.rss.append((self.now(), total))

    # -- jobs ---------------------------------------------------------------------------------

    def _create(self, slot: int) -> None:
        draw = self.draw
        name = f"soak-{slot:03d}"
        run_policy: dict[str, Any] = {
            "backoffLimit": draw.choice((1, 3, 6, 10, 10)),
            "progressDeadlineSeconds": PROGRESS_DEADLINE,
        }
        if draw.random() < 0.4:
            run_policy["restartStrategy"] = "Recreate"
        spec: dict[str, Any] = {
            "nodes": draw.choice((1, 2, 2, 3)),
            "runPolicy": run_policy,
            "template": {"nodeSelector": self.label},
        }
        queued = self._queued(slot)
        manifest = queued_manifest(name, slot, spec) if queued else job_manifest(name, **spec)
        try:
            created = self.jobs.create(manifest)
        except UNAVAILABLE as error:
            if isinstance(error, kubernetes.client.ApiException) and error.status == 422:
                raise
            self.to_create.add(slot)  # the next tick tries again
            return
        self.to_create.discard(slot)
        self.nodes_of[created["metadata"]["uid"]] = spec["nodes"]
        self.generations[slot] = Generation(
            name=name,
            uid=created["metadata"]["uid"],
            spec=spec,
            work=draw.uniform(25, 70),
            created=self.now(),
            workload=kueue.workload_name(load_job(created)) if queued else None,
        )

    def _observe(self) -> None:
        try:
            listed = self.cluster.custom_objects.list_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL
            )["items"]
            self.pods = self.cluster.core.list_namespaced_pod(self.namespace).items
        except UNAVAILABLE:
            return  # the API server restarting: the next tick sees it
        self.statuses = {
            j["metadata"]["uid"]: {**(j.get("status") or {}), "name": j["metadata"]["name"]}
            for j in listed
        }
        self._check_pods()
        self._count_silent_node_pods()

    def _count_silent_node_pods(self) -> None:
        """A pod scheduled on a silent node before it was marked unreachable is lost with it: a
        node fault for its job, as for the pods that ran there when it went silent. Its kubelet
        stopped too (kwok would run it until evicted, then delete it by name)."""
        with contextlib.suppress(*UNAVAILABLE):
            self._stop_kubelet_of(p for p in self.pods if p.spec.node_name in self.silent)
        for generation in self.generations.values():
            for pod in self._current(generation):
                if pod.spec.node_name in self.silent and pod.metadata.uid not in self.on_silent:
                    self.on_silent.add(pod.metadata.uid)
                    generation.hits.append(self._hit(generation, "node", pod.spec.node_name, 1))

    def _pods_of(self, generation: Generation) -> list[Any]:
        return [
            p
            for p in self.pods
            if any(o.uid == generation.uid for o in (p.metadata.owner_references or []))
        ]

    def _status(self, generation: Generation) -> dict[str, Any]:
        return self.statuses.get(generation.uid, {})

    def _current(self, generation: Generation) -> list[Any]:
        """The job's live pods of its current attempt."""
        attempt = str(self._status(generation).get("attempt", 0))
        return [
            p
            for p in self._pods_of(generation)
            if p.metadata.labels.get(names.LABEL_ATTEMPT) == attempt
            and p.metadata.deletion_timestamp is None
            and p.status.phase in LIVE
        ]

    def _group_runs(self, generation: Generation) -> bool:
        """Whether the current group's workers all run: its rank 0 reports."""
        current = self._current(generation)
        return (
            self._status(generation).get("phase") == "Running"
            and len(current) == generation.spec["nodes"]
            and all(p.status.phase == "Running" for p in current)
        )

    @staticmethod
    def _this_pod(pod: Any) -> dict[str, Any]:
        """Delete options that reach this pod only, not the next attempt's of the same name."""
        return {"preconditions": {"uid": pod.metadata.uid}}

    def _end(self, pod: Any, exit_code: int) -> bool:
        """Make this pod (by its uid: the next attempt's pod may hold its name) exit."""
        body = {
            "metadata": {"uid": pod.metadata.uid, "annotations": {SIM_EXIT_CODE: str(exit_code)}}
        }
        try:
            self.cluster.core.patch_namespaced_pod(pod.metadata.name, self.namespace, body)
        except UNAVAILABLE:
            return False
        return True

    def _steady(self, generation: Generation) -> bool:
        status = self._status(generation)
        if status.get("phase") != "Running" or status.get("replacing"):
            return False
        pods = self._pods_of(generation)
        current = self._current(generation)
        return (
            len(current) == generation.spec["nodes"]
            and all(p.status.phase == "Running" for p in current)
            and all(p.metadata.deletion_timestamp is None for p in pods)
        )

    def _drive(self, *, creating: bool) -> None:
        """Play each job's rank 0 (progress reports) and end the ones that worked long enough;
        create a slot's job again once the last one is gone."""
        for slot in sorted(self.to_create):
            if creating:
                self._create(slot)
        for slot, generation in list(self.generations.items()):
            if self._drive_one(generation):
                self.ended.append(generation)
                del self.generations[slot]
                if creating:
                    self._create(slot)
        for slot, preemptor in list(self.preemptors.items()):
            if self._drive_one(preemptor):
                del self.preemptors[slot]
                if (preemptor.outcome or {}).get("phase") != "Succeeded":
                    self._violate(preemptor.name, f"the preemptor ended {preemptor.outcome}")

    def _drive_one(self, generation: Generation) -> bool:
        """One job's tick; True once it ended and is gone with its pods."""
        status = self._status(generation)
        phase = status.get("phase")
        if generation.resume_at is not None and self.now() >= generation.resume_at:
            self._set_suspend(generation, False)
            generation.resume_at = None
        if phase in ("Succeeded", "Failed") or generation.outcome is not None:
            if generation.outcome is None:
                generation.outcome = {**status, "at": self.now()}
                self._delete(generation)
                return False
            return not self._pods_of(generation) and generation.uid not in self.statuses
        if self._group_runs(generation):
            self._report(generation, status)  # whatever is left of earlier groups
        if not self._steady(generation):
            generation.running_since = None
            return False
        if generation.running_since is None:
            generation.running_since = self.now()
        due = self.now() - generation.running_since >= generation.work
        if generation.finishing:
            due = self.now() - generation.finishing >= FINISH_AGAIN_AFTER
            self.finished_again += due
        if due and not generation.hung_at:
            generation.finishing = self.now()
            for pod in self._current(generation):
                self._end(pod, 0)
        return False

    def _report(self, generation: Generation, status: dict[str, Any]) -> None:
        key = group_of(status)
        if generation.hung_at is not None:
            if generation.hung_at == key:
                return
            generation.hung_at = None  # restarted: its new group reports again
        if self.now() - generation.reported < REPORT_EVERY and generation.reported_attempt == key:
            return
        generation.step += 1
        patch = training_patch(
            epoch=1,
            epochs=100,
            loss=0.5,
            val_accuracy=0.5,
            best_val_accuracy=0.5,
            images_per_sec=1000.0,
            now=datetime.now(UTC),
        )
        training = patch["status"]["training"]
        training.update(
            position_fields(
                epoch=1,
                epochs=100,
                step=generation.step,
                steps_per_epoch=10**6,
                remaining_seconds=600,
            )
        )
        with contextlib.suppress(*UNAVAILABLE):
            self.jobs.report_training(generation.name, training)
        generation.reported, generation.reported_attempt = self.now(), key

    def _set_suspend(self, generation: Generation, suspend: bool) -> None:
        """The user's suspend (or resume): for a queued job, through its Workload."""
        with contextlib.suppress(*UNAVAILABLE):
            if generation.workload is not None:
                self.cluster.custom_objects.patch_namespaced_custom_object(
                    kueue.GROUP,
                    kueue.VERSION,
                    self.namespace,
                    kueue.WORKLOADS,
                    generation.workload,
                    {"spec": {"active": not suspend}},
                )
                return
            body = {"spec": {"runPolicy": {"suspend": suspend}}}
            self.cluster.custom_objects.patch_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL, generation.name, body
            )

    def _delete(self, generation: Generation) -> None:
        with contextlib.suppress(*UNAVAILABLE):
            self.jobs.delete(generation.name)

    # -- faults -------------------------------------------------------------------------------

    def _apply(self, fault: Fault) -> None:
        if fault.kind in CLUSTER_FAULTS:
            getattr(self, f"_fault_{fault.kind}")(fault)
            self.applied[fault.kind] += 1
            return
        generation = self.generations.get(fault.job)
        if generation is None or generation.finishing or generation.outcome is not None:
            self.applied["missed"] += 1
            return
        status = self._status(generation)
        steady = self._steady(generation)
        before = (status, steady)
        effective, target = getattr(self, f"_fault_{fault.kind}")(generation, fault)
        index = fault.worker % generation.spec["nodes"]
        expect = RESTART
        if fault.kind in PROBES:
            self.probed[f"{fault.kind}: {target.split(': ')[-1]}"] += 1
            generation.hits.append(self._hit(generation, fault.kind, target, 0, "", before))
            return
        if fault.kind in ("suspend", "preempt") or (
            fault.kind in ("delete", "evict") and generation.in_place and index != 0
        ):
            expect = PREEMPTION
        hit = self._hit(generation, fault.kind, target, effective, expect, before)
        generation.hits.append(hit)
        self.applied[fault.kind if effective else "missed"] += 1

    def _worker_pod(self, generation: Generation, fault: Fault) -> Any | None:
        index = str(fault.worker % generation.spec["nodes"])
        for pod in self._current(generation):
            if pod.metadata.labels.get(names.LABEL_REPLICA_INDEX) == index:
                return pod
        return None

    def _fault_kill(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        pod = self._worker_pod(generation, fault)
        if pod is None or pod.status.phase != "Running":
            return 0, "no running worker"
        if pod.spec.node_name in self.silent:  # no kubelet reports the exit: the node's loss
            return 0, f"{pod.metadata.name} on a silent node"
        return int(self._end(pod, 137)), pod.metadata.name

    def _fault_delete(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        pod = self._worker_pod(generation, fault)
        if pod is None:
            return 0, "no live worker"
        try:
            self.cluster.core.delete_namespaced_pod(
                pod.metadata.name, self.namespace, body=self._this_pod(pod)
            )
        except UNAVAILABLE:
            return 0, pod.metadata.name
        return 1, pod.metadata.name

    def _fault_evict(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        pod = self._worker_pod(generation, fault)
        if pod is None:
            return 0, "no live worker"
        name = pod.metadata.name
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": self.namespace},
            "deleteOptions": self._this_pod(pod),
        }
        try:
            self.cluster.core.create_namespaced_pod_eviction(name, self.namespace, eviction)
        except UNAVAILABLE:
            return 0, name
        return 1, name

    def _fault_hang(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        del fault
        status = self._status(generation)
        key = group_of(status)
        if status.get("phase") != "Running" or generation.reported_attempt != key:
            return 0, "rank 0 not reporting"
        generation.hung_at = key
        return 1, "rank 0 quiet"

    def _fault_suspend(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        del fault
        if generation.resume_at is not None:
            return 0, "suspended already"
        phase = self._status(generation).get("phase")
        self._set_suspend(generation, True)
        generation.resume_at = self.now() + SUSPENDED_SECONDS
        # A Restarting job may be under way again (its next group made) when the operator
        # reads the suspend: then it is a preemption.
        return (1 if phase in UNDER_WAY else 0), f"suspend ({phase})"

    def _fault_preempt(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        """A job of higher priority in the slot's ClusterQueue, which it fills: Kueue evicts
        the slot's job if admitted, runs this one (`PREEMPTOR_WORKS` s) and readmits it."""
        if not self._queued(fault.job):
            return 0, "no Kueue"
        if fault.job in self.preemptors:
            return 0, "a preemptor is there already"
        phase = self._status(generation).get("phase")
        self.preemptors_created += 1
        name = f"preempt-{fault.job:03d}-{self.preemptors_created}"
        spec: dict[str, Any] = {
            "nodes": QUEUE_CPU,
            "runPolicy": {"backoffLimit": 10},
            "template": {"nodeSelector": self.label},
        }
        manifest = queued_manifest(name, fault.job, spec, self.preemptor_class)
        try:
            created = self.jobs.create(manifest)
        except UNAVAILABLE:
            return 0, "the API server away"
        self.preemptors[fault.job] = Generation(
            name=name,
            uid=created["metadata"]["uid"],
            spec=spec,
            work=PREEMPTOR_WORKS,
            created=self.now(),
        )
        return (1 if preemption_reaches(phase) else 0), f"{name} ({phase})"

    def _fault_forge(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        """What a training script may send with the token every worker of its job holds: a
        status of the operator's own fields (an end, the counts reset, every worker replaced),
        or a progress report the operator cannot read."""
        attempt = int(self._status(generation).get("attempt", 0))
        forgeries: list[dict[str, Any]] = [
            {"phase": "Succeeded"},
            {"phase": "Failed"},
            {"restarts": 0, "preemptions": 0, "attempt": attempt + 3},
            {"replacing": list(range(1, generation.spec["nodes"] + 2))},
            # a report the policy lets through, with a time past the calendar in UTC
            {"training": {"attempt": attempt, "updatedAt": "9999-12-31T23:59:59-01:00"}},
        ]
        forged = forgeries[fault.worker % len(forgeries)]
        what = ", ".join(sorted(forged))
        try:
            account = f"{generation.name}-trainer"
            token = service_account_token(self.cluster, self.namespace, account)
            with self.cluster.client_with_token(token) as client:
                kubernetes.client.CustomObjectsApi(client).patch_namespaced_custom_object_status(
                    names.GROUP,
                    names.VERSION,
                    self.namespace,
                    names.PLURAL,
                    generation.name,
                    {"status": forged},
                )
        except kubernetes.client.ApiException as error:
            return 0, f"{what}: refused {error.status}"
        except UNAVAILABLE:
            return 0, f"{what}: the API server away"
        if set(forged) - {"training", "rankRestart"}:  # the status policy's to refuse
            self._violate(generation.name, f"a worker's token wrote status {what}")
        return 0, f"{what}: taken"

    def _fault_impostor(self, generation: Generation, fault: Fault) -> tuple[int, str]:
        """A pod anyone who may make pods in the namespace can make: no owner, labelled as
        the job's worker 0 of its current attempt; it runs and ends at once, 0 or 1."""
        code = fault.worker % 2
        name = f"{generation.name}-impostor-{len(self.impostors)}"
        labels = {
            names.LABEL_MANAGED_BY: names.MANAGED_BY,
            names.LABEL_JOB_NAME: generation.name,
            names.LABEL_ATTEMPT: str(self._status(generation).get("attempt", 0)),
            names.LABEL_REPLICA_INDEX: "0",
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {SIM_EXIT_CODE: str(code)},
            },
            "spec": {
                "nodeSelector": self.label,
                "containers": [{"name": "trainer", "image": "registry.invalid/impostor"}],
            },
        }
        # A tenant of the namespace meets the pod policy; the admin, whom it lets pass (the
        # tests' operator runs as the admin), stands for a cluster without it.
        by_tenant = fault.worker % 4 < 2
        try:
            maker = core_as(self.cluster, self.namespace, TENANT) if by_tenant else None
            (maker or self.cluster.core).create_namespaced_pod(self.namespace, pod)
        except kubernetes.client.ApiException as error:
            if error.status != 403:
                return 0, f"{name}: the API server away"
            return 0, f"{name}: refused {error.status}"
        except UNAVAILABLE:
            return 0, f"{name}: the API server away"
        self.impostors.append(name)
        if by_tenant:
            self._violate(generation.name, f"a tenant made {name}, labelled as its worker 0")
        return 0, f"{name} exiting {code}: made by {'a tenant' if by_tenant else 'the admin'}"

    def _fault_node(self, fault: Fault) -> None:
        """A soak node stops reporting (its kubelet and lease frozen); it comes back later."""
        node = self.node_names[fault.node]
        if node in self.silent:
            return
        silence = {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}}
        try:
            self._stop_kubelet_of(self._bound_to(node))
            self.cluster.core.patch_node(node, silence)
            self._stop_kubelet_of(self._bound_to(node))  # those bound in between
        except UNAVAILABLE:
            self.applied["missed"] += 1
            return
        coordination = kubernetes.client.CoordinationV1Api(self.cluster.api)
        dead_holder = {
            "spec": {
                "holderIdentity": "a-kubelet-that-stopped",
                "leaseDurationSeconds": 3600,
                "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
            }
        }
        with contextlib.suppress(*UNAVAILABLE):
            coordination.patch_namespaced_lease(node, "kube-node-lease", dead_holder)
        self.silent[node] = self.now() + random.Random(fault.at).uniform(*NODE_SILENT_SECONDS)
        for generation in self.generations.values():
            if generation.outcome is not None:
                continue
            mine = [p for p in self._current(generation) if p.spec.node_name == node]
            self.on_silent |= {p.metadata.uid for p in mine}
            generation.hits.append(self._hit(generation, "node", node, len(mine)))

    def _bound_to(self, node: str) -> list[Any]:
        """The pods bound to `node` now (not at the last tick: one bound since would be left
        to kwok)."""
        selector = f"spec.nodeName={node}"
        return self.cluster.core.list_namespaced_pod(self.namespace, field_selector=selector).items

    def _stop_kubelet_of(self, pods: Iterable[Any]) -> None:
        """Mark `pods` as on a kubelet that stopped (`KUBELET_STOPPED`): neither kwok nor the
        pod remover touches them, whatever their node's annotation is in kwok's cache."""
        for pod in pods:
            annotations = pod.metadata.annotations or {}
            if all(annotations.get(k) == v for k, v in KUBELET_STOPPED.items()):
                continue
            body = {"metadata": {"uid": pod.metadata.uid, "annotations": KUBELET_STOPPED}}
            with contextlib.suppress(kubernetes.client.ApiException):  # gone, or a successor
                self.cluster.core.patch_namespaced_pod(pod.metadata.name, self.namespace, body)

    def _hit(
        self,
        generation: Generation,
        kind: str,
        target: str,
        effective: int,
        expect: str = RESTART,
        before: tuple[dict[str, Any], bool] | None = None,
    ) -> Hit:
        """The fault as it reached the job, whose (status, steadiness) were `before` it."""
        status, steady = before or (self._status(generation), self._steady(generation))
        return Hit(
            at=self.now(),
            kind=kind,
            target=target,
            effective=effective,
            steady=steady,
            expect=expect,
            phase=str(status.get("phase")),
            attempt=int(status.get("attempt", 0)),
            restarts=int(status.get("restarts", 0)),
            preemptions=int(status.get("preemptions", 0)),
        )

    def _node_back(self, node: str) -> None:
        """Its kubelet back: it finishes what it was told while away, confirming the deletion
        of a pod by its uid as a kubelet does (the pod remover acts on a pod's events, and a
        node coming back makes none)."""
        try:
            bound = self._bound_to(node)
        except UNAVAILABLE:
            return  # the next tick brings it back
        for pod in bound:
            name, uid = pod.metadata.name, pod.metadata.uid
            with contextlib.suppress(*UNAVAILABLE):
                if pod.metadata.deletion_timestamp is not None:
                    confirmed = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
                    self.cluster.core.delete_namespaced_pod(name, self.namespace, body=confirmed)
                else:
                    running = {"uid": uid, "annotations": dict.fromkeys(KUBELET_STOPPED)}
                    self.cluster.core.patch_namespaced_pod(
                        name, self.namespace, {"metadata": running}
                    )
            self.terminating_since.pop(uid, None)
        coordination = kubernetes.client.CoordinationV1Api(self.cluster.api)
        with contextlib.suppress(*UNAVAILABLE):
            coordination.delete_namespaced_lease(node, "kube-node-lease")
        with contextlib.suppress(*UNAVAILABLE):
            self.cluster.core.patch_node(
                node, {"metadata": {"annotations": {"kwok.x-k8s.io/node": "fake"}}}
            )
        del self.silent[node]

    def _fault_leader(self, fault: Fault) -> None:
        del fault
        self.operator_away.append(self.now())
        leader = self._leader()
        if leader is None:
            self.applied["missed"] += 1
            return
        leader.kill()
        leader.wait()
        self.killed_operators += 1
        # As the kubelet would: the killed replica comes back, as a standby.
        self._start_operator(len(self.operators))

    def _fault_apiserver(self, fault: Fault) -> None:
        del fault
        self.operator_away.append(self.now())
        load_dev_cluster().restart_apiserver()

    # -- invariants ---------------------------------------------------------------------------

    def _violate(self, job: str, what: str) -> None:
        if any(v.job == job and v.what == what for v in self.violations):
            return
        self.violations.append(Violation(self.now(), job, what))

    def _check_pods(self) -> None:
        live: dict[tuple[str, str, str], list[str]] = defaultdict(list)
        by_job: dict[str, list[Any]] = defaultdict(list)
        now = self.now()
        seen_terminating = set()
        for pod in self.pods:
            owner = next(iter(pod.metadata.owner_references or []), None)
            if owner is None:
                continue
            by_job[owner.uid].append(pod)
            labels = pod.metadata.labels or {}
            if pod.metadata.deletion_timestamp is not None:
                seen_terminating.add(pod.metadata.uid)
                since = self.terminating_since.setdefault(pod.metadata.uid, now)
                if now - since > TERMINATING_AT_MOST and pod.spec.node_name not in self.silent:
                    self._violate(owner.name, f"pod {pod.metadata.name} left Terminating")
                continue
            nodes = self.nodes_of.get(owner.uid)
            index = labels.get(names.LABEL_REPLICA_INDEX, "")
            if nodes is not None and index.isdigit() and int(index) >= nodes:
                self._violate(owner.name, f"pod {pod.metadata.name}: worker {index} of {nodes}")
            if pod.status.phase in LIVE:
                key = (
                    owner.uid,
                    labels.get(names.LABEL_ATTEMPT, ""),
                    labels.get(names.LABEL_REPLICA_INDEX, ""),
                )
                live[key].append(pod.metadata.name)
        self.terminating_since = {
            uid: t for uid, t in self.terminating_since.items() if uid in seen_terminating
        }
        for (uid, attempt, index), pods in live.items():
            if len(pods) > 1:
                job = self.statuses.get(uid, {}).get("name", uid)
                self._violate(job, f"two live pods for worker {index} of attempt {attempt}: {pods}")
        for uid, owned in by_job.items():
            running = {
                int(p.metadata.labels.get(names.LABEL_ATTEMPT, 0))
                for p in owned
                if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
            }
            if len(running) > 1:
                job = self.statuses.get(uid, {}).get("name", uid)
                self._violate(job, f"workers of attempts {sorted(running)} run at once")
        for n, (process, log_path) in enumerate(
            zip(self.operators, self.operator_logs, strict=True)
        ):
            code = process.poll()
            if code is None or code == -signal.SIGKILL or n in self.restarted_operators:
                continue
            self.restarted_operators.add(n)
            if "leadership lost: exiting" in log_path.read_text(errors="replace"):
                self.lost_leadership += 1  # by design; the kubelet starts it again
                self._start_operator(len(self.operators))
            else:
                self._violate("operator", f"operator pid {process.pid} exited {code}")

    def _settle(self) -> None:
        """No more faults: every job still under way runs to its end (silent nodes come back)."""
        for node in list(self.silent):
            self._node_back(node)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            self._observe()
            self._drive(creating=False)
            if not self.generations and not self.preemptors:
                return
            time.sleep(0.5)
        for generation in [*self.generations.values(), *self.preemptors.values()]:
            self._violate(
                generation.name,
                f"did not end within 5 min of the soak's end: {self._status(generation)}",
            )

    def _delete_all(self) -> None:
        """Every child goes with its job (the ended jobs were deleted as they ended)."""
        for generation in [*self.generations.values(), *self.preemptors.values()]:
            self._delete(generation)
        kinds = (*CHILD_KINDS, f"{kueue.WORKLOADS}.{kueue.GROUP}")
        for impostor in self.impostors:  # no job owns them: nothing else removes them
            with contextlib.suppress(*UNAVAILABLE):
                self.cluster.core.delete_namespaced_pod(impostor, self.namespace)
        for child in children_left(self.cluster, self.namespace, kinds=kinds):
            self._violate(child, "left after its job was deleted")
        for generation in self.ended:
            self._check_counts(generation)

    def _check_counts(self, generation: Generation) -> None:
        outcome = generation.outcome or {}
        phase, restarts = outcome.get("phase"), int(outcome.get("restarts", 0))
        preemptions = int(outcome.get("preemptions", 0))
        limit = int(generation.spec["runPolicy"]["backoffLimit"])
        name = f"{generation.name} ({generation.uid[:8]})"
        if phase == "Failed":
            reason = (outcome.get("failure") or {}).get("reason")
            conditions = {c["type"]: c for c in outcome.get("conditions", [])}
            ended = conditions.get("Failed", {}).get("reason")
            if ended != "BackoffLimitExceeded":
                self._violate(
                    name, f"Failed with {ended} (failure {reason}), not BackoffLimitExceeded"
                )
            elif not limit - self._lost_beyond_one(generation) <= restarts <= limit:
                self._violate(name, f"Failed at {restarts} restarts, backoffLimit {limit}")
        if restarts > limit:
            self._violate(name, f"{restarts} restarts past backoffLimit {limit}")
        if phase == "Succeeded" and not generation.finishing:
            self._violate(name, "Succeeded before the soak ended its workers")
        effective = sum(hit.effective for hit in generation.hits)
        if restarts + preemptions > effective:
            self._violate(
                name, f"{restarts} restarts + {preemptions} preemptions from {effective} faults"
            )
        isolated = self._isolated(generation)
        want = Counter(hit.expect for hit in isolated)
        slack = 1 if phase == "Failed" else 0  # the failing restart is not counted
        if restarts < want[RESTART] - slack:
            self._violate(name, f"{restarts} restarts, {want[RESTART]} isolated faults to restart")
        if preemptions < want[PREEMPTION]:
            self._violate(
                name, f"{preemptions} preemptions, {want[PREEMPTION]} isolated faults to resume"
            )

    def _lost_beyond_one(self, generation: Generation) -> int:
        """How many restarts short of its backoffLimit the job may fail: an in-place job counts
        each lost worker, so more losses than it has left in one decision (two workers of a
        lost node, faults within AT_ONCE seconds) fail it with those restarts never made. A
        job that restarts its group counts one restart for them all."""
        if not generation.in_place:
            return 0
        effective = [hit for hit in generation.hits if hit.effective]
        at_once = [
            sum(o.effective for o in effective if 0 <= o.at - hit.at <= AT_ONCE)
            for hit in effective
        ]
        return max(at_once, default=1) - 1

    def _away_within(self, at: float, seconds: float) -> bool:
        """Whether the operator was away within `seconds` after `at` (a hang's progress
        deadline due then fires on its return, with whatever else reached the job meanwhile),
        or in the `OPERATOR_AWAY` seconds before: a fault it was acting on when it went (its
        pods deleted, the status that says why not written) meets the next leader's reading
        of what is left, another fault at once."""
        return any(-OPERATOR_AWAY <= away - at <= seconds for away in self.operator_away)

    def _isolated(self, generation: Generation) -> list[Hit]:
        effective = [hit for hit in generation.hits if hit.effective]
        ended = (generation.outcome or {}).get("at", float("inf"))
        result = []
        for hit in effective:
            around = {"node": NODE_QUIET_AROUND, "hang": HANG_QUIET_AROUND}.get(
                hit.kind, QUIET_AROUND
            )
            alone = all(
                other is hit or abs(other.at - hit.at) > max(around, QUIET_AROUND)
                for other in effective
            ) and not self._away_within(hit.at, AT_ONCE if hit.kind != "hang" else around)
            if alone and hit.steady and hit.effective == 1 and ended - hit.at > around:
                result.append(hit)
        return result

    # -- the report ---------------------------------------------------------------------------

    def history(self, job: str) -> str:
        """The faults and outcome of `job` as a violation names it: "name (uid)" is that one
        job object, a bare name each generation of it."""
        name, _, uid = job.partition(" (")
        generations = [
            g
            for g in [*self.ended, *self.generations.values()]
            if g.name == name and g.uid.startswith(uid.rstrip(")"))
        ]
        lines = []
        for generation in generations:
            lines.append(f"{generation.name} uid {generation.uid[:8]} spec {generation.spec}")
            lines += ["  " + hit.line() for hit in generation.hits]
            lines.append(f"  outcome: {generation.outcome}")
        return "\n".join(lines)

    def _warm_rss(self) -> list[int]:
        """The largest replica's RSS, sampled from the first minute on (imports and first
        lists done): the soak's start is the first of them."""
        return [mib for at, mib in self.rss if mib and at >= RSS_FROM]

    def results(self) -> dict[str, Any]:
        """The run's figures, as docs/BENCHMARKS.md quotes them."""
        rss = self._warm_rss()
        return {
            "seed": self.settings.seed,
            "settings": dataclasses.asdict(self.settings),
            "minutes": round(self.now() / 60, 1),
            "jobs_ended": dict(Counter(str((g.outcome or {}).get("phase")) for g in self.ended)),
            "faults_applied": dict(sorted(self.applied.items())),
            "probes": dict(sorted(self.probed.items())),
            "hits": sum(len(g.hits) for g in self.ended),
            "hits_not_isolated": sum(len(g.hits) - len(self._isolated(g)) for g in self.ended),
            "preemptors_created": self.preemptors_created,
            "operators_killed": self.killed_operators,
            "ends_sent_again": self.finished_again,
            "operators_exited_on_lost_leadership": self.lost_leadership,
            "operator_rss_mib": {"start": rss[0], "end": rss[-1], "max": max(rss)} if rss else {},
            "violations": [
                {**dataclasses.asdict(v), "history": self.history(v.job)} for v in self.violations
            ],
        }

    def summary(self) -> str:
        overlapping = sum(len(g.hits) - len(self._isolated(g)) for g in self.ended if g.hits)
        outcomes = Counter((g.outcome or {}).get("phase") for g in self.ended)
        rss = self._warm_rss()
        return "\n".join(
            [
                f"soak seed {self.settings.seed}: {self.settings.minutes:g} min, "
                f"{len(self.ended)} jobs ended ({dict(outcomes)}), {self.settings.jobs} at once "
                f"on {self.settings.nodes} kwok nodes",
                f"faults applied: {dict(sorted(self.applied.items()))}; hits not isolated "
                f"(overlapping or during a recovery): {overlapping}",
                f"probes (must change nothing): {dict(sorted(self.probed.items()))}",
                f"operator RSS (MiB): start {rss[0] if rss else '?'}, end "
                f"{rss[-1] if rss else '?'}, max {max(rss) if rss else '?'}",
                f"invariant violations: {len(self.violations)}",
            ]
        )


CHILD_KINDS = ("services", "networkpolicies", "serviceaccounts", "roles", "rolebindings")


def children_left(
    cluster: Cluster, namespace: str, wait_s: float = 120, kinds: Iterable[str] = CHILD_KINDS
) -> list[str]:
    """What is left in `namespace` once its jobs were deleted: its pods after `wait_s`, and each
    child a job owns of `kinds` (Services, NetworkPolicies, the reporter's RBAC)."""
    deadline = time.monotonic() + wait_s
    while (pods := cluster.core.list_namespaced_pod(namespace).items) and (
        time.monotonic() < deadline
    ):
        time.sleep(1)
    owned = cluster.kubectl(
        "get",
        ",".join(kinds),
        f"--namespace={namespace}",
        "-o",
        "jsonpath={range .items[?(@.metadata.ownerReferences)]}{.kind}/{.metadata.name} {end}",
    ).stdout.split()
    return [f"Pod/{pod.metadata.name}" for pod in pods] + owned


def settings_from_env(
    default_minutes: float, default_jobs: int, default_seed: int | None = None
) -> Settings:
    """SOAK_SEED, SOAK_MINUTES, SOAK_JOBS, SOAK_FAULTS_PER_MINUTE; without a seed, a new one
    (or `default_seed`)."""
    if default_seed is None:
        default_seed = random.SystemRandom().randrange(10**6)
    seed = int(os.environ.get("SOAK_SEED") or default_seed)
    minutes = float(os.environ.get("SOAK_MINUTES") or default_minutes)
    jobs = int(os.environ.get("SOAK_JOBS") or default_jobs)
    return Settings(
        seed=seed,
        minutes=minutes,
        jobs=jobs,
        nodes=max(3, jobs // 8),
        faults_per_minute=float(os.environ.get("SOAK_FAULTS_PER_MINUTE") or max(6, jobs)),
    )
