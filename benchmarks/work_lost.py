"""Work lost per failure: the seconds of training a job redoes after a failure at a random
time, with checkpoints only at epoch ends (before) and with checkpoints by time and a SIGTERM
that saves at the step the ranks agree on (after).

The real trainer under its launcher (`python -m ddp_trainer.torchrun`, 2 processes, gloo) on a
small Wide-ResNet and synthetic data. Each variant is a job that fails again and again: every
run goes on from the newest checkpoint in its variant's directory, as the operator's restart
would, and trains until its failure; the next run's "resuming at step N" line says where the
job went on from. The failure lands at a uniformly random point of the run's first two epochs
(seeded: the same points for every variant), and the variants' runs are interleaved.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.markdown import Section, raw_note
from benchmarks.trainer import SHARED, WRN, cpu_count, cpu_description, trainer_env
from ddp_trainer.contract import EXIT_PREEMPTED

PROCESSES = 2
BATCH = 32  # per process: short steps, so a failure's place within a step matters little
SAMPLES, QUICK_SAMPLES = 9600, 1536  # an epoch of 120 steps (about 20 s here), and of 20
INTERVAL_S = 4.0  # the timed checkpoints' interval, a fifth of an epoch here
DEFAULT_INTERVAL_S = 300  # options.DEFAULT_CHECKPOINT_SECONDS
WINDOW_EPOCHS = 2  # a failure lands in the first this many epochs of a run
SEED = 26
SIGNALLED = 128  # the launcher ends as 128 + the signal that killed its rank
POLL_S = 0.02
START_TIMEOUT_S = 300  # a loaded two-core machine takes long to import torch three times
EXIT_TIMEOUT_S = 120
RESUMED = re.compile(r"resuming at step (\d+)")
TRAINING_SAMPLES = re.compile(r"(\d+) training and \d+ validation samples")


@dataclass(frozen=True)
class Variant:
    label: str
    checkpoints: str
    failure: str
    signal: signal.Signals
    extra: tuple[str, ...]


TIMED = (f"--checkpoint-every-seconds={INTERVAL_S:g}",)
VARIANTS = (
    Variant(
        "before",
        "epoch ends (`--checkpoint-every-seconds 0`)",
        "SIGKILL to rank 1",
        signal.SIGKILL,
        ("--checkpoint-every-seconds=0",),
    ),
    Variant(
        "after, a crash",
        f"epoch ends and every {INTERVAL_S:g} s",
        "SIGKILL to rank 1",
        signal.SIGKILL,
        TIMED,
    ),
    Variant(
        "after, a preemption",
        f"epoch ends and every {INTERVAL_S:g} s",
        "SIGTERM to the launcher",
        signal.SIGTERM,
        TIMED,
    ),
)


class Run:
    """One launch of the trainer: its rank 0's steps as they happen, and its failure."""

    def __init__(self, directory: Path, index: int, args: list[str]) -> None:
        self.log_path = directory / f"run{index}.log"
        self.steps_path = directory / f"steps{index}.rank0"  # DDP_TRAINER_BATCH_LOG's file
        env = trainer_env(PROCESSES)
        env["DDP_TRAINER_BATCH_LOG"] = str(directory / f"steps{index}")
        launcher = [sys.executable, "-m", "ddp_trainer.torchrun", "--standalone"]
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [*launcher, f"--nproc-per-node={PROCESSES}", "-m", "ddp_trainer", *args],
                env=env,
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.seen: list[tuple[float, int]] = []  # (when it was seen, global step)

    def latest_step(self) -> int | None:
        """The last global step rank 0 has finished, as its batch log says."""
        try:
            text = self.steps_path.read_text()
        except FileNotFoundError:
            return None
        lines = text[: text.rfind("\n") + 1].splitlines()  # a line half written is not read
        if not lines:
            return None
        step = int(json.loads(lines[-1])["step"])
        if not self.seen or self.seen[-1][1] != step:
            self.seen.append((time.monotonic(), step))
        return step

    def wait_for_step(self, step: int | None = None, timeout: float = START_TIMEOUT_S) -> int:
        """Until rank 0 has finished `step` (None: any step); the step it has finished."""
        deadline = time.monotonic() + timeout
        while True:
            latest = self.latest_step()
            if latest is not None and (step is None or latest >= step):
                return latest
            if self.process.poll() is not None:
                raise RuntimeError(f"the trainer ended before step {step}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no step {step} in {timeout:.0f} s:\n{self.tail()}")
            time.sleep(POLL_S)

    def resumed_from(self) -> int:
        """The step this run went on from: its "resuming at step N" line, read once it trains
        (the line comes before the first step; none: from the start)."""
        self.wait_for_step()
        found = RESUMED.search(self.log_path.read_text())
        return int(found.group(1)) if found else 0

    def steps_per_epoch(self) -> int:
        found = TRAINING_SAMPLES.search(self.log_path.read_text())
        if found is None:
            raise RuntimeError(f"the trainer did not say its dataset's size:\n{self.tail()}")
        return math.ceil(math.ceil(int(found.group(1)) / PROCESSES) / BATCH)

    def pace(self) -> tuple[float, int]:
        """Seconds and steps between the first and the last step seen."""
        if len(self.seen) < 2:
            return 0.0, 0
        (first_at, first), (last_at, last) = self.seen[0], self.seen[-1]
        return last_at - first_at, last - first

    def fail(self, how: signal.Signals) -> tuple[int, float]:
        """SIGKILL to the last rank (a lost node, the OOM killer) or SIGTERM to the launcher
        (the kubelet stopping the pod, which torchrun passes on to the ranks); the launcher's
        exit code and the seconds from the signal to its exit."""
        target = self.process.pid if how == signal.SIGTERM else self._rank_pid(PROCESSES - 1)
        sent = time.monotonic()
        os.kill(target, how)
        try:
            code = self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(
                f"no exit {EXIT_TIMEOUT_S} s after {how.name}:\n{self.tail()}"
            ) from None
        return code, time.monotonic() - sent

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-30:])

    def _rank_pid(self, rank: int) -> int:
        """The launcher's child that runs `rank` (its RANK variable)."""
        pid = self.process.pid
        children = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += (task / "children").read_text().split()
        for child in children:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ:
                return int(child)
        raise RuntimeError(f"no process of rank {rank} under the launcher {pid}")


@dataclass
class Job:
    """One variant's job: its checkpoint directory, the runs so far and what each failure
    cost."""

    variant: Variant
    directory: Path
    samples: int
    runs: int = 0
    reached: int | None = None  # the step the last failure hit at
    exit_seconds: float = 0.0  # from the last failure's signal to the launcher's exit
    redone: list[int] = field(default_factory=list)  # steps, per failure
    exits: list[float] = field(default_factory=list)
    seconds: float = 0.0  # seen training, for the step time
    steps: int = 0
    steps_per_epoch: int = 0

    def start(self) -> tuple[Run, int]:
        """The next run, once it trains, and the step it went on from; the failure before it,
        written down."""
        self.runs += 1
        args = [
            *SHARED[:2],
            f"--batch-size={BATCH}",
            *SHARED[3:],
            *WRN[:3],
            f"--synthetic-samples={self.samples}",
            "--epochs=1000",  # the job never ends by itself
            "--no-report-progress",
            "--checkpoint-dir=checkpoints",
            *self.variant.extra,
        ]
        run = Run(self.directory, self.runs, args)
        try:
            resumed = run.resumed_from()
        except BaseException:
            run.stop()
            raise
        if self.reached is not None:
            self.redone.append(max(0, self.reached - resumed))  # steps trained after the
            self.exits.append(self.exit_seconds)  # signal, before the agreed step, are kept
        return run, resumed

    def fail_once(self, place: float) -> None:
        """A run that fails at `place` (0 to 1) of its first epochs of steps."""
        run, resumed = self.start()
        try:
            self.steps_per_epoch = run.steps_per_epoch()
            offset = place * WINDOW_EPOCHS * self.steps_per_epoch
            run.wait_for_step(resumed + 1 + int(offset))
            seconds, steps = run.pace()
            if steps:
                time.sleep((offset % 1) * seconds / steps)  # into the next step
            reached = run.latest_step()
            code, self.exit_seconds = run.fail(self.variant.signal)
        finally:
            run.stop()
        expected = (
            EXIT_PREEMPTED if self.variant.signal == signal.SIGTERM else SIGNALLED + signal.SIGKILL
        )
        if code != expected:
            raise RuntimeError(f"{self.variant.label}: exit {code}, not {expected}:\n{run.tail()}")
        self.reached = reached
        seconds, steps = run.pace()
        self.seconds += seconds
        self.steps += steps

    def resume_last(self) -> None:
        run, _ = self.start()
        run.stop()


def run(args: argparse.Namespace) -> Section:
    failures = 1 if args.quick else max(3, args.repeats)
    samples = QUICK_SAMPLES if args.quick else SAMPLES
    places = _places(failures)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    started = time.time()
    print("work lost per failure", file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        jobs = []
        for number, variant in enumerate(VARIANTS):
            directory = Path(scratch) / f"job{number}"
            directory.mkdir()
            jobs.append(Job(variant, directory, samples))
        for failure, place in enumerate(places):
            for job in jobs:  # interleaved
                job.fail_once(place)
                print(
                    f"  [{failure + 1}/{failures}] {job.variant.label}: failed at step "
                    f"{job.reached}",
                    file=sys.stderr,
                )
        for job in jobs:
            job.resume_last()
    minutes = (time.time() - started) / 60
    raw = {
        "failures": failures,
        "places": places,  # where in the window each failure hit, as a fraction of it
        "load": load,
        "minutes": minutes,
        "jobs": [
            {
                "variant": job.variant.label,
                "samples": job.samples,
                "redone_steps": job.redone,
                "signal_to_exit_s": job.exits,
                "seconds": job.seconds,
                "steps": job.steps,
            }
            for job in jobs
        ],
    }
    return Section(_section(jobs, failures, load, minutes), raw)


def _places(failures: int) -> list[float]:
    """Stratified: one uniformly random point in each of `failures` equal parts of the window,
    so that a few failures still cover it."""
    draw = random.Random(SEED)
    return [(part + draw.random()) / failures for part in range(failures)]


def _spread(values: list[float], unit: str = "", digits: int = 1) -> str:
    """The median (lowest-highest)."""
    median = f"{statistics.median(values):.{digits}f}{unit}"
    if len(values) == 1:
        return median
    return f"{median} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _section(jobs: list[Job], failures: int, load: float, minutes: float) -> str:
    # One step time for all: checkpoints cost far less than the load of a shared machine varies.
    step = sum(job.seconds for job in jobs) / sum(job.steps for job in jobs)
    rows = []
    for job in jobs:
        exits = _spread(job.exits, " s") if job.variant.signal == signal.SIGTERM else "-"
        rows.append(
            f"| {job.variant.label} | {job.variant.checkpoints} | {job.variant.failure} "
            f"| {_spread([n * step for n in job.redone], ' s')} "
            f"| {_spread([float(n) for n in job.redone], digits=0)} | {exits} |"
        )
    first = jobs[0]
    epoch_s = first.steps_per_epoch * step
    cpu_model, _ = cpu_description()
    return "\n".join(
        [
            "## Work lost per failure",
            "",
            "Command: `python -m benchmarks work-lost` (part of `make bench`; `--quick` for a "
            f"smoke run that writes nothing). {raw_note('work-lost')}",
            "",
            f"Machine: {cpu_count()} CPUs, {cpu_model}, no GPU. Load average {load:.1f} at the "
            f"start (shared machine: noisy). The run took {minutes:.1f} minutes.",
            "",
            "The trainer under its launcher (`python -m ddp_trainer.torchrun`, 2 processes, "
            f"gloo), WRN-10-2 on {first.samples} synthetic 1x28x28 samples, batch {BATCH} per "
            f"process: an epoch is {first.steps_per_epoch} steps of {step:.3f} s, "
            f"{epoch_s:.0f} s here. Each variant is a job that fails again and again: every "
            "run goes on from the newest checkpoint, as the operator's restart would, and "
            f"fails at a uniformly random point of its first {WINDOW_EPOCHS} epochs (seeded, "
            f"one in each of {failures} equal parts of them: the same points for every "
            "variant; the variants' runs interleaved). Work redone = the step rank 0 had "
            "finished when the signal was sent (its batch log, `DDP_TRAINER_BATCH_LOG`) minus "
            'the step the next run resumed from (its "resuming at step N" line), times the '
            "step time seen in all runs (evaluation and saves included). Median "
            f"(lowest-highest) of {failures} failures each.",
            "",
            "| variant | checkpoints | failure | work redone per failure | steps redone "
            "| signal to exit |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"The interval, {INTERVAL_S:g} s, is scaled to these short runs: at the default, "
            f"`checkpointEverySeconds` {DEFAULT_INTERVAL_S}, a crash redoes about half the "
            f"interval on average, {DEFAULT_INTERVAL_S // 2} s, against half an epoch before. "
            "A preemption redoes nothing: the ranks agree on a step after the signal, rank 0 "
            "saves it and every rank exits "
            f"{EXIT_PREEMPTED}; the next run resumes at that step (the steps trained between "
            "the signal and the agreed step are kept, counted as 0 redone). Its cost is the "
            "time from the signal to the exit, which the pod's grace period must cover.",
        ]
    )
