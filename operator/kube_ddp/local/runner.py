"""`kube-ddp run --local`: a job's worker pods as local processes, run by the operator's rules.

A second shell around the pure core, as the kopf handlers are the first: every tick observes
the processes as PodViews, asks `status.decide`, and carries out its actions. CreateWorkers
starts processes built by `build_children`; DeletePods stops them (SIGTERM, then SIGKILL after
the grace period) and a stopped process is a deleted pod. Group restarts, the first failure,
success of worker 0, backoffLimit and activeDeadlineSeconds are thus the operator's own
decisions; nothing here decides them again.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TextIO

from ddp_trainer.contract import EXIT_PREEMPTED
from kube_ddp import plot
from kube_ddp.api import DDPTrainingJob, JobStatus
from kube_ddp.local import preflight
from kube_ddp.local.console import Console, WorkerRecord, progress_line
from kube_ddp.local.endpoint import StatusEndpoint
from kube_ddp.local.plan import (
    LOCAL_DIR_OPTIONS,
    LocalSettings,
    Machine,
    Overrides,
    fit_job,
    local_state_dir,
    worker_launches,
)
from kube_ddp.local.processes import LocalPod
from kube_ddp.status import FINISHED, CreateWorkers, DeletePods, decide, peers_grace_left
from kube_ddp.status.history import add_points

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C
TICK_S = 0.2  # how often the core is asked, at the latest; an exit or a report asks at once


@dataclass(frozen=True)
class RunOptions:
    overrides: Overrides = field(default_factory=Overrides)
    logs_dir: Path | None = None
    stop_grace_s: float = 10.0  # SIGTERM to SIGKILL, as terminationGracePeriodSeconds
    plot_path: Path | None = None  # the training curve as a PNG, at the end
    job_dir: Path | None = None  # the job file's directory (None: read from stdin)


def run_local(
    job: DDPTrainingJob,
    options: RunOptions,
    machine: Machine,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Run `job` here until it Succeeded (0) or Failed (1), or Ctrl-C (130). A job that
    cannot run here raises plan.LocalRunError before anything starts."""
    fitted = fit_job(job, options.overrides, machine, local_state_dir(job, os.environ))
    preflight.missing_packages(fitted)
    workdir = preflight.workdir(fitted, options.job_dir, Path.cwd())
    console = Console(out, err, options.logs_dir)
    with (
        tempfile.TemporaryDirectory(prefix="kube-ddp-run-") as scratch,
        StatusEndpoint(fitted, Path(scratch)) as endpoint,
    ):
        settings = LocalSettings(machine, endpoint.url, endpoint.token_file, workdir)
        # Every pod's env must resolve here (valueFrom a Secret cannot) before anything starts.
        worker_launches(fitted, 0, tuple(range(fitted.spec.nodes)), settings)
        spec = fitted.spec
        console.note(
            f"running {fitted.name}: {spec.nodes} workers x {spec.procs_per_node} "
            f"process{'es' if spec.procs_per_node > 1 else ''}, "
            f"{spec.accelerator.type}, {spec.effective_backend}; worker DNS names -> 127.0.0.1, "
            f"port {job.spec.port} -> {spec.port}"
        )
        for said in moved_dirs(job, fitted):
            console.note(said)
        if workdir is not None:
            console.note(
                f"the workers run in {workdir}, beside the job file, where its script is (as "
                "the job's pods have it where its volume mounts it)"
            )
        unmet = preflight.unmet_requests(fitted, machine, preflight.memory_bytes())
        if unmet is not None:
            console.note(unmet)
        runner = _Runner(fitted, settings, console, endpoint, options.stop_grace_s)
        try:
            with _sigterm_as_interrupt():
                status = runner.run()
        except KeyboardInterrupt:
            console.end_progress()
            console.note(
                "interrupted: SIGTERM to every worker, as on a suspend or a drain (the "
                "trainer saves a checkpoint and stops; Ctrl-C again kills them now)"
            )
            stopped = runner.stop_all()
            listed = ", ".join(stopped) if stopped else "none were running"
            console.note(f"stopped every worker process it started ({listed})")
            step = endpoint.checkpoint_step()
            if step is not None and any(r.exit_code == EXIT_PREEMPTED for r in runner.records):
                console.note(
                    f"the job stopped with a checkpoint at step {step}: "
                    "running it again resumes from there"
                )
            console.summary(fitted.name, runner.status, runner.records)
            _curve(fitted, runner.status, console, options.plot_path)
            console.close()
            return EXIT_INTERRUPTED
        finally:
            runner.stop_all()  # a no-op after a normal end; after an error, nothing is left
        console.summary(fitted.name, status, runner.records)
        _curve(fitted, status, console, options.plot_path)
        console.close()
        return EXIT_SUCCEEDED if status.phase == "Succeeded" else EXIT_FAILED


def moved_dirs(job: DDPTrainingJob, fitted: DDPTrainingJob) -> list[str]:
    """A note for each trainer directory the local run keeps elsewhere than the job says."""
    was, now = job.spec.trainer, fitted.spec.trainer
    if was is None or now is None:
        return []
    before_all, after_all = was.model_dump(by_alias=True), now.model_dump(by_alias=True)
    said = []
    for option in LOCAL_DIR_OPTIONS:
        before, after = before_all.get(option), after_all.get(option)
        if before != after:
            said.append(f"{option} {before} -> {after} (here, not the cluster's volume)")
    return said


def _curve(job: DDPTrainingJob, status: JobStatus, console: Console, png: Path | None) -> None:
    """The run's curve after the summary; a PNG that cannot be written is a note (the run's
    exit code stays the job's)."""
    title = f"{job.namespace}/{job.name}"
    plot.show(status.training_history, title, console.err, console.err, png)


class _Runner:
    def __init__(
        self,
        job: DDPTrainingJob,
        settings: LocalSettings,
        console: Console,
        endpoint: StatusEndpoint,
        stop_grace_s: float,
    ) -> None:
        self.job = job
        self.settings = settings
        self.console = console
        self.endpoint = endpoint
        self.stop_grace_s = stop_grace_s
        self.status = JobStatus()
        self.pods: dict[str, LocalPod] = {}
        self.records: list[WorkerRecord] = []
        self._record_of: dict[int, WorkerRecord] = {}
        self._wake = threading.Event()
        self._started = time.monotonic()
        endpoint.on_report = self._wake.set

    def run(self) -> JobStatus:
        while True:
            self._wake.clear()
            self._tick()
            if self.status.phase in FINISHED and not self.pods:
                return self.status
            self._wake.wait(TICK_S)

    def _tick(self) -> None:
        for pod in list(self.pods.values()):
            pod.kill_if_overdue(self.stop_grace_s)
            if not pod.alive and (pod.stop_requested_at is not None or self._finished):
                self._forget(pod)  # a deleted pod is gone; so is every pod once the job ended
        progress = self.endpoint.progress()
        observed = self.status.model_copy(
            update={
                "training": progress or self.status.training,
                "rank_restart": self.endpoint.rank_restart() or self.status.rank_restart,
                # every epoch end reported, as the endpoint got it: the core adds the newest
                "training_history": add_points(
                    self.status.training_history, self.endpoint.take_epoch_ends()
                ),
            }
        )
        job = self.job.model_copy(update={"status": observed})
        views = [pod.view() for pod in self.pods.values()]
        decision = decide(job, views, datetime.now(UTC))
        self.status = decision.status
        for event in decision.events:
            self.console.event(event)
        for action in decision.actions:
            if isinstance(action, CreateWorkers):
                self._create(action)
            elif isinstance(action, DeletePods):
                for name in action.names:
                    if name in self.pods:
                        self.pods[name].stop()
            # DeleteJob (ttlSecondsAfterFinished): locally there is no job object to delete.
        if self._finished and peers_grace_left(self.status, datetime.now(UTC)) == 0:
            for pod in self.pods.values():
                if pod.alive and pod.stop_requested_at is None:
                    # cleanPodPolicy None keeps them in a cluster; a local run ends with its job.
                    self.console.note(f"stopping {pod.name}: the job has finished")
                    pod.stop()
        elapsed = time.monotonic() - self._started
        self.console.progress(progress_line(self.job.name, self.status), elapsed)

    @property
    def _finished(self) -> bool:
        return self.status.phase in FINISHED

    def _create(self, action: CreateWorkers) -> None:
        launches = worker_launches(
            self.job, action.attempt, action.indices, self.settings, action.pod_names
        )
        for launch in launches:
            pod = LocalPod(launch, self.console.worker_line, self._wake.set)
            pod.start()
            self.pods[pod.name] = pod
            record = WorkerRecord(pod=pod.name, attempt=launch.attempt, pid=pod.pid)
            self.records.append(record)
            self._record_of[id(pod)] = record
            if action.attempt == 0 or pod.pid is None:
                what = f"pid {pod.pid}" if pod.pid else f"not started: {pod.message}"
                self.console.note(f"{pod.name} ({what}): {shlex.join(launch.argv)}")

    def _forget(self, pod: LocalPod) -> None:
        pod.reap()
        record = self._record_of.pop(id(pod))
        record.exit_code, record.reason = pod.exit_code, pod.reason
        # Stopped: ended by the runner's signal, not by itself before or despite it.
        record.stopped = (
            pod.stop_requested_at is not None
            and pod.exit_code != 0
            and pod.ended_at is not None
            and pod.ended_at >= pod.stop_requested_at
        )
        if pod.ended_at is not None:
            record.seconds = pod.ended_at - pod.started_at
        del self.pods[pod.name]

    def stop_all(self) -> list[str]:
        """Stop every process still running and wait for each; the names of those stopped."""
        running = [pod for pod in self.pods.values() if pod.alive]
        for pod in running:
            pod.stop()
        deadline = time.monotonic() + self.stop_grace_s
        try:
            while any(pod.alive for pod in running) and time.monotonic() < deadline:
                time.sleep(0.05)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: kill at once
        for pod in running:
            pod.kill_if_overdue(0)
        while any(pod.alive for pod in running):
            time.sleep(0.05)
        for pod in list(self.pods.values()):
            self._forget(pod)
        return [f"{pod.name} (pid {pod.pid})" for pod in running]


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a `kill`, a CI timeout) ends the run like Ctrl-C: every worker is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
