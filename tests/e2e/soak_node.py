"""The soak on the real node: a few real trainer jobs at once (the digits MLP on CPU, a
checkpoint every epoch, two workers each), hit at random times from a seed by the faults real
processes meet: a rank SIGKILLed in a pod that stays, a pod's main process SIGKILLed, a rank
SIGSTOPped (a hang: the progress deadline restarts the group), the pod deleted, evicted through
the Eviction API, the job suspended and resumed, the operator's process SIGKILLed; a third of
the job faults get a second one on the same job within 4 s. A job that ends is deleted and
another takes its slot until the time is up.

Invariants, as it goes: never two live pods for one worker of one attempt, never two
attempts' workers running at once, no pod Terminating over 90 s, and a resumed run never goes
back before its last checkpoint (`resumedFromStep` >= every checkpoint step reported before
it). At the end: every job Succeeded, restarts + preemptions no more than the faults that hit
it and at least one where a fault hit it mid-training, every child gone after its job is
deleted; the operator's RSS sampled every 30 s."""

from __future__ import annotations

import dataclasses
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from kube_ddp import names
from tests.cluster.operator_support import Jobs
from tests.cluster.soak import LIVE, TERMINATING_AT_MOST, children_left
from tests.e2e.platform import Platform, container_pid
from tests.e2e.test_jobs import DIGITS, cpu_job

JOB_KINDS = ("rank", "worker", "hang", "delete", "evict", "suspend")
KINDS = (*JOB_KINDS, "operator")
SECOND_FAULT = ("rank", "worker", "delete", "evict")
EPOCHS = 15
SUSPENDED_SECONDS = 15


@dataclass(frozen=True)
class NodeFault:
    at: float  # seconds from the soak's start
    kind: str
    slot: int  # which of the jobs running at once


def node_plan(seed: int, minutes: float, jobs: int) -> list[NodeFault]:
    """The faults of a run, from the seed alone: every kind once in random order first, then
    at random, 20-50 s apart, after 60 s (the first jobs train by then)."""
    rng = random.Random(seed)
    end, at = minutes * 60, 60.0
    kinds = rng.sample(KINDS, len(KINDS))
    faults: list[NodeFault] = []
    while True:
        at += rng.uniform(20, 50)
        if at >= end:
            return faults
        kind = kinds.pop() if kinds else rng.choice(KINDS)
        slot = rng.randrange(jobs)
        faults.append(NodeFault(at, kind, slot))
        if kind in JOB_KINDS and rng.random() < 0.3:
            second = NodeFault(at + rng.uniform(0.5, 4), rng.choice(SECOND_FAULT), slot)
            faults += [second] if second.at < end else []


@dataclass
class Run:
    """One job of a slot, from its creation to its deletion."""

    name: str
    hits: list[str] = field(default_factory=list)
    mid_training_hits: int = 0
    newest_checkpoint: int = 0
    resumed_from: int | None = None
    resume_at: float | None = None
    outcome: dict[str, Any] | None = None


@dataclass(frozen=True)
class Violation:
    at: float
    job: str
    what: str


class NodeSoak:
    def __init__(
        self,
        platform: Platform,
        jobs: Jobs,
        operator_namespace: str,
        *,
        seed: int,
        minutes: float,
        at_once: int,
    ) -> None:
        self.platform, self.jobs, self.cluster = platform, jobs, jobs.cluster
        self.operator_namespace = operator_namespace
        self.seed, self.minutes, self.at_once = seed, minutes, at_once
        self.faults = node_plan(seed, minutes, at_once)
        self.slots: dict[int, Run] = {}
        self.ended: list[Run] = []
        self.made = 0
        self.applied: Counter[str] = Counter()
        self.missed: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.rss: list[tuple[float, int]] = []
        self.terminating_since: dict[str, float] = {}
        self.resumes_seen = 0  # resumedFromStep seen to change to a step past 0: each checked
        self.started = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.started

    def run(self) -> None:
        for slot in range(self.at_once):
            self._create(slot)
        pending, next_rss = list(self.faults), 0.0
        while self.now() < self.minutes * 60 or self.slots:
            self._observe(creating=self.now() < self.minutes * 60)
            while pending and pending[0].at <= self.now():
                self._apply(pending.pop(0))
            if self.now() >= next_rss:
                self._sample_rss()
                next_rss = self.now() + 30
            if self.now() > self.minutes * 60 + 600:
                for run in self.slots.values():
                    self._violate(run.name, f"did not end within 10 min: {self._status(run)}")
                break
            time.sleep(1)
        self._delete_all()

    # --- jobs -------------------------------------------------------------------------------

    def _create(self, slot: int) -> None:
        name = f"soak-{slot}-{self.made}"
        self.made += 1
        checkpoints = self.platform.scratch_volume(f"ckpt-{name}", self.jobs.namespace)
        checkpoints["name"] = "checkpoints"
        manifest = cpu_job(
            self.platform,
            name,
            trainer={**DIGITS, "model": "mlp", "epochs": EPOCHS, "checkpointDir": "/checkpoints"},
            template={
                "volumes": [checkpoints],
                "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}],
            },
            runPolicy={"backoffLimit": 30, "progressDeadlineSeconds": 60},
        )
        self.jobs.create(manifest)
        self.slots[slot] = Run(name)

    def _status(self, run: Run) -> dict[str, Any]:
        return self.jobs.status(run.name)

    def _observe(self, *, creating: bool) -> None:
        for slot, run in list(self.slots.items()):
            status = self._status(run)
            self._check_resume(run, status.get("training") or {})
            if run.resume_at is not None and self.now() >= run.resume_at:
                self._set_suspend(run, False)
                run.resume_at = None
            if status.get("phase") in ("Succeeded", "Failed") and run.resume_at is None:
                run.outcome = status
                self._check_counts(run)
                self.ended.append(run)
                self.jobs.delete(run.name)
                del self.slots[slot]
                if creating:
                    self._create(slot)
        self._check_pods()

    def _check_resume(self, run: Run, training: dict[str, Any]) -> None:
        resumed = training.get("resumedFromStep")
        if resumed is not None and resumed != run.resumed_from:
            self.resumes_seen += resumed > 0
            if resumed < run.newest_checkpoint:
                self._violate(
                    run.name,
                    f"resumed from step {resumed}, before its checkpoint at step "
                    f"{run.newest_checkpoint}",
                )
            run.resumed_from = resumed
        step = (training.get("checkpoint") or {}).get("step")
        if step is not None:
            run.newest_checkpoint = max(run.newest_checkpoint, step)

    def _set_suspend(self, run: Run, suspend: bool) -> None:
        self.cluster.custom_objects.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            self.jobs.namespace,
            names.PLURAL,
            run.name,
            {"spec": {"runPolicy": {"suspend": suspend}}},
        )

    # --- faults -----------------------------------------------------------------------------

    def _apply(self, fault: NodeFault) -> None:
        if fault.kind == "operator":
            hit = self._kill_operator()
            self._count(fault, hit, None)
            return
        run = self.slots.get(fault.slot)
        if run is None or run.resume_at is not None:
            self._count(fault, False, run)
            return
        status = self._status(run)
        mid_training = (
            status.get("phase") == "Running"
            and (status.get("training") or {}).get("epoch", 0) < EPOCHS - 2
        )
        try:
            hit = getattr(self, f"_fault_{fault.kind}")(run)
        except (
            ApiException,
            ProcessLookupError,
            FileNotFoundError,
            StopIteration,
            AssertionError,
            IndexError,
            TypeError,
        ):
            hit = False  # the pod or process went in the meantime
        self._count(fault, hit, run)
        if hit:
            run.hits.append(f"{self.now():.0f}s {fault.kind}")
            run.mid_training_hits += mid_training

    def _count(self, fault: NodeFault, hit: bool, run: Run | None) -> None:
        (self.applied if hit else self.missed)[fault.kind] += 1
        print(
            f"{self.now():6.0f}s {fault.kind:8} {run.name if run else '-':12} "
            f"{'hit' if hit else 'missed'}",
            flush=True,
        )

    def _worker(self, run: Run) -> Any:
        pods = [
            p
            for p in self.jobs.pods(run.name)
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        ]
        return random.Random(f"{self.seed}{self.now():.0f}").choice(pods) if pods else None

    def _fault_rank(self, run: Run) -> bool:
        return self._on_worker(run, self.platform.kill_rank)

    def _fault_worker(self, run: Run) -> bool:
        return self._on_worker(run, self.platform.kill)

    def _fault_hang(self, run: Run) -> bool:
        return self._on_worker(run, lambda pod: self.platform.kill_rank(pod, signal.SIGSTOP))

    def _fault_delete(self, run: Run) -> bool:
        namespace = self.jobs.namespace
        return self._on_worker(
            run, lambda pod: self.cluster.core.delete_namespaced_pod(pod.metadata.name, namespace)
        )

    def _fault_evict(self, run: Run) -> bool:
        namespace = self.jobs.namespace

        def evict(pod: Any) -> None:
            name = pod.metadata.name
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            }
            self.cluster.core.create_namespaced_pod_eviction(name, namespace, eviction)

        return self._on_worker(run, evict)

    def _on_worker(self, run: Run, act: Callable[[Any], object]) -> bool:
        """`act` on one of the job's running workers, chosen at random; False: none runs."""
        pod = self._worker(run)
        if pod is None:
            return False
        act(pod)
        return True

    def _fault_suspend(self, run: Run) -> bool:
        if self._status(run).get("phase") in ("Succeeded", "Failed"):
            return False
        self._set_suspend(run, True)
        run.resume_at = self.now() + SUSPENDED_SECONDS
        return True

    def _operator_pod(self) -> Any:
        pods = self.cluster.core.list_namespaced_pod(
            self.operator_namespace, label_selector="app.kubernetes.io/name=kube-ddp"
        ).items
        running = [
            p
            for p in pods
            if p.status.phase == "Running"
            and p.status.container_statuses
            and p.status.container_statuses[0].state.running
        ]
        return running[0] if running else None

    def _kill_operator(self) -> bool:
        pod = self._operator_pod()
        if pod is None:
            return False
        self.platform.kill(pod)  # the kubelet starts its container again
        return True

    def _sample_rss(self) -> None:
        pod = self._operator_pod()
        if pod is None:
            return
        try:
            text = Path(f"/proc/{container_pid(pod)}/status").read_text()
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            return
        kib = next(int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS"))
        self.rss.append((self.now(), kib // 1024))

    # --- invariants -------------------------------------------------------------------------

    def _violate(self, job: str, what: str) -> None:
        print(f"VIOLATION {self.now():.0f}s {job}: {what}", flush=True)
        self.violations.append(Violation(round(self.now(), 1), job, what))

    def _check_pods(self) -> None:
        pods = self.cluster.core.list_namespaced_pod(self.jobs.namespace).items
        live: dict[tuple[str, str, str], list[str]] = defaultdict(list)
        running: dict[str, set[str]] = defaultdict(set)
        terminating = set()
        for pod in pods:
            owner = next(iter(pod.metadata.owner_references or []), None)
            if owner is None:
                continue
            labels = pod.metadata.labels or {}
            attempt = labels.get(names.LABEL_ATTEMPT, "")
            if pod.metadata.deletion_timestamp is not None:
                terminating.add(pod.metadata.uid)
                since = self.terminating_since.setdefault(pod.metadata.uid, self.now())
                if self.now() - since > TERMINATING_AT_MOST:
                    self._violate(owner.name, f"pod {pod.metadata.name} left Terminating")
                continue
            if pod.status.phase in LIVE:
                index = labels.get(names.LABEL_REPLICA_INDEX, "")
                live[(owner.name, attempt, index)].append(pod.metadata.name)
            if pod.status.phase == "Running":
                running[owner.name].add(attempt)
        self.terminating_since = {
            uid: t for uid, t in self.terminating_since.items() if uid in terminating
        }
        for (job, attempt, index), names_ in live.items():
            if len(names_) > 1:
                self._violate(job, f"two live pods for worker {index} of attempt {attempt}")
        for job, attempts in running.items():
            if len(attempts) > 1:
                self._violate(job, f"workers of attempts {sorted(attempts)} run at once")

    def _check_counts(self, run: Run) -> None:
        outcome = run.outcome or {}
        counted = int(outcome.get("restarts", 0)) + int(outcome.get("preemptions", 0))
        said = f"{outcome.get('phase')}, {counted} counted, hits {run.hits}"
        if outcome.get("phase") != "Succeeded":
            self._violate(run.name, f"ended {said}: {outcome.get('failure')}")
        if counted > len(run.hits):
            self._violate(run.name, f"more restarts and preemptions than faults: {said}")
        if run.mid_training_hits and counted == 0:
            self._violate(run.name, f"a fault mid-training counted nothing: {said}")
        if (outcome.get("training") or {}).get("epoch") != EPOCHS:
            self._violate(run.name, f"ended at epoch {outcome.get('training')}, not {EPOCHS}")

    def _delete_all(self) -> None:
        for run in self.slots.values():
            self.jobs.delete(run.name)
        for child in children_left(self.cluster, self.jobs.namespace):
            self._violate(child, "left after its job was deleted")

    # --- what it found ----------------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        rss = [mib for _, mib in self.rss]
        return {
            "seed": self.seed,
            "minutes": round(self.now() / 60, 1),
            "jobs_at_once": self.at_once,
            "jobs_ended": dict(Counter(str((r.outcome or {}).get("phase")) for r in self.ended)),
            "faults_applied": dict(sorted(self.applied.items())),
            "faults_missed": dict(sorted(self.missed.items())),
            "second_faults": sum(
                1
                for a, b in zip(self.faults, self.faults[1:], strict=False)
                if b.at - a.at < 5 and a.slot == b.slot
            ),
            "restarts": sum(int((r.outcome or {}).get("restarts", 0)) for r in self.ended),
            "preemptions": sum(int((r.outcome or {}).get("preemptions", 0)) for r in self.ended),
            "resumes_checked": self.resumes_seen,
            "operator_rss_mib": {"start": rss[0], "end": rss[-1], "max": max(rss)} if rss else {},
            "violations": [
                {**dataclasses.asdict(v), "history": self.history(v.job)} for v in self.violations
            ],
        }

    def history(self, job: str) -> str:
        run = next((r for r in [*self.ended, *self.slots.values()] if r.name == job), None)
        return f"hits: {run.hits}" if run else ""
