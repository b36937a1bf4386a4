"""Trainer benchmark: ddp_trainer against the tutorials' DDP loop, and a world of one against the
bare loop (`benchmarks/bare_loop.py`: the fewest operations a step can be).

Every figure is training throughput (images/s summed over ranks, epochs after the first, no
evaluation) reported by the runs themselves, the median of --repeats runs. The runs of one
group are interleaved (A, B, C, A, B, C, ...) so that load from other work on a shared machine
falls on every variant alike. GPU figures are benchmarks/gpu.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.markdown import Section, raw_note

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
# What the operator's pods run: kube-ddp's torchrun (its agent), one node here.
POD_LAUNCHER = (sys.executable, "-m", "ddp_trainer.torchrun", "--standalone")
COMMAND = "make bench"  # = python -m benchmarks all --repeats 3

BATCH_SIZE = 128  # per process
# Same optimizer on both sides: the reference loop uses SGD with momentum, no weight decay.
SHARED = (
    "--dataset=synthetic",
    "--synthetic-shape=1x28x28",
    f"--batch-size={BATCH_SIZE}",
    "--weight-decay=0",
)
MLP = ("--model=mlp", "--synthetic-samples=20480", "--epochs=3")
WRN = ("--model=wide-resnet", "--wrn-depth=10", "--wrn-width=2", "--synthetic-samples=1536")
WRN_EPOCHS = "--epochs=2"
# A world of one against the floor: 1,000 steps an epoch (80 % of the samples train), the
# first epoch warm-up, so 2,000 steps measured a run: windows long enough to tell 5 %.
MLP_LONG = ("--model=mlp", "--synthetic-samples=160000", "--epochs=3")
MLP_TWO = ("--model=mlp", "--synthetic-samples=160000", "--epochs=5")  # 500 steps a rank an epoch
MEASURED_STEPS = 2000


@dataclass(frozen=True)
class Rate:
    """Images/s over repeated runs."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def __str__(self) -> str:
        if len(self.samples) == 1:
            return f"{self.median:,.0f}"
        return f"{self.median:,.0f} ({min(self.samples):,.0f}-{max(self.samples):,.0f})"


@dataclass(frozen=True)
class Variant:
    """One way to run a workload: which program, how many processes, launched how."""

    label: str
    module: str  # ddp_trainer or benchmarks.reference_loop
    processes: int = 2
    torchrun: bool = True  # False: one plain process, no launcher
    extra: tuple[str, ...] = ()

    def command(self, workload: tuple[str, ...], summary: Path) -> list[str]:
        args = [*SHARED, *workload, *self.extra]
        if self.module == "ddp_trainer":
            args += [f"--summary-file={summary}", "--no-report-progress"]
        if not self.torchrun:
            return [sys.executable, "-m", self.module, *args]
        launcher = [*POD_LAUNCHER, f"--nproc-per-node={self.processes}"]
        return [*launcher, "-m", self.module, *args]

    def images_per_sec(self, workload: tuple[str, ...]) -> float:
        return float(self.result(workload)["images_per_sec"])

    def result(self, workload: tuple[str, ...], timeout_s: int = 900) -> dict[str, Any]:
        """What the run reports: ddp_trainer's summary, or the reference loop's last line."""
        with tempfile.TemporaryDirectory() as scratch:
            summary = Path(scratch) / "summary.json"
            done = subprocess.run(
                self.command(workload, summary),
                env=trainer_env(self.processes),
                cwd=scratch,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{self.label} failed:\n{done.stdout}\n{done.stderr}")
            if self.module == "ddp_trainer":
                return dict(json.loads(summary.read_text()))
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))  # rank 0's line


def measure(
    title: str, variants: list[Variant], workload: tuple[str, ...], repeats: int
) -> dict[str, Rate]:
    """Images/s of each variant over `repeats` runs, interleaved across variants."""
    print(f"trainer benchmark: {title}", file=sys.stderr)
    samples: dict[str, list[float]] = {variant.label: [] for variant in variants}
    for repeat in range(repeats):
        for variant in variants:
            rate = variant.images_per_sec(workload)
            samples[variant.label].append(rate)
            print(f"  [{repeat + 1}/{repeats}] {variant.label}: {rate:,.0f} img/s", file=sys.stderr)
    return {label: Rate(tuple(values)) for label, values in samples.items()}


def trainer_env(processes: int) -> dict[str, str]:
    """This environment without the trainer's own variables (test hooks, the operator's), the
    cores shared among `processes`, and this repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEDDP_", "DDP_"))}
    env["OMP_NUM_THREADS"] = str(max(1, cpu_count() // processes))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_line(setting: str, loads: list[float], each: str, minutes: float) -> str:
    """A report's "Machine:" sentence: CPUs and model, what runs on them, the load before
    each measurement and how long the run took."""
    loads = loads or [0.0]
    return (
        f"Machine: {cpu_count()} CPUs, {cpu_description()[0]}; {setting}. Load average (1 min) "
        f"before each {each} {min(loads):.1f} to {max(loads):.1f}. The run took "
        f"{minutes:.1f} minutes."
    )


def cpu_description() -> tuple[str, bool]:
    """The CPU model, and whether it computes bf16 natively (AMX or AVX512-BF16)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU", False
    lines = cpuinfo.splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if "model name" in line), "")
    flags = next((line for line in lines if line.startswith("flags")), "")
    return model or "unknown CPU", "amx_bf16" in flags or "avx512_bf16" in flags


def run(args: argparse.Namespace) -> Section:
    import torch  # here, not at the top: the recovery report's tests import cpu_description

    repeats = 1 if args.quick else args.repeats
    mlp_two_args = MLP_TWO if not args.quick else (*MLP_TWO, "--synthetic-samples=16000")
    mlp_long = MLP_LONG if not args.quick else (*MLP_LONG, "--synthetic-samples=16000")
    wrn = (*WRN, WRN_EPOCHS) if not args.quick else (*WRN, "--synthetic-samples=512", "--epochs=2")
    cpu_model, native_bf16 = cpu_description()
    mixed = "bf16" if native_bf16 else "fp32"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    started = time.time()

    ours = Variant("ddp_trainer", "ddp_trainer")
    reference = Variant("reference", "benchmarks.reference_loop")
    ours_mixed = Variant("ddp_trainer mixed", "ddp_trainer", extra=(f"--precision={mixed}",))
    bare = Variant("bare loop", "benchmarks.bare_loop", 1, torchrun=False)
    bare_ddp = Variant("bare loop in DDP", "benchmarks.bare_loop", 1)
    ours_one = Variant("ddp_trainer", "ddp_trainer", 1)
    reference_one = Variant("reference", "benchmarks.reference_loop", 1, torchrun=False)

    mlp_two = measure("MLP, 2 processes, 2,000 steps", [ours, reference], mlp_two_args, repeats)
    one = [bare, ours_one, bare_ddp, reference_one]
    mlp_one = measure("MLP, 1 process, 2,000 steps", one, mlp_long, repeats)
    wrn_two = measure("WRN-10-2, 2 processes", [ours_mixed, reference, ours], wrn, repeats)
    minutes = (time.time() - started) / 60

    rows: list[tuple[str, str, str, Rate, Rate]] = [
        ("MLP 784-128-64-10", "2 (torchrun)", "fp32", mlp_two["ddp_trainer"], mlp_two["reference"]),
        (
            "MLP 784-128-64-10",
            "1 (the pods' command)",
            "fp32",
            mlp_one["ddp_trainer"],
            mlp_one["reference"],
        ),
        ("WRN-10-2", "2 (torchrun)", mixed, wrn_two["ddp_trainer mixed"], wrn_two["reference"]),
    ]
    if native_bf16:
        rows.append(
            ("WRN-10-2", "2 (torchrun)", "fp32", wrn_two["ddp_trainer"], wrn_two["reference"])
        )
    lines = [
        "## Trainer",
        "",
        f"Command: `{COMMAND}` (the trainer part alone: `python -m benchmarks trainer`; "
        f"`--quick` for a smoke run that writes nothing). {raw_note('trainer')}",
        "",
        f"Machine: {cpu_count()} CPUs, {cpu_model}"
        f"{' with bf16 in hardware (AMX, AVX512-BF16)' if native_bf16 else ''}, no GPU; "
        f"torch {torch.__version__}, Python {platform.python_version()}. "
        f"Load average {load:.1f} at the start: the machine is shared, so figures are noisy. "
        f"The run took {minutes:.1f} minutes.",
        "",
        "Training throughput in images/s over all ranks (epochs after the first, evaluation "
        f"excluded): median (lowest-highest) of {repeats} interleaved runs; the MLP's runs "
        f"measure {MEASURED_STEPS:,} steps each (a Wide-ResNet step takes a quarter of a second "
        "here: its runs are shorter). Same model, "
        "synthetic 1x28x28 data, "
        "batch size 128 per process, SGD with momentum, world size and launcher on both sides "
        "(gloo on CPU).",
        "",
        "| model | processes | ddp_trainer precision | ddp_trainer | reference loop | speed-up |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {model} | {world} | {precision} | {ours_rate} | {reference_rate} "
            f"| {ours_rate.median / reference_rate.median:.1f}x |"
            for model, world, precision, ours_rate, reference_rate in rows
        ),
        "",
        "Goal: at least 2x for the MLP and a small Wide-ResNet. With two processes on CPU each "
        "step of either loop also waits for one gloo all-reduce over loopback, which on this "
        "two-core machine takes about as long as the MLP's own computation: a faster data "
        "path cannot shorten that part.",
        "",
        "A world of one against the floor: the MLP, one process, "
        f"{MEASURED_STEPS:,} steps measured a run (one more epoch of warm-up), fp32. The bare "
        "loop (`benchmarks/bare_loop.py`) is forward, loss, backward and SGD on in-memory data "
        "gathered by index, nothing read back; in DDP is the same under the pods' launcher "
        "in torch's DistributedDataParallel on a gloo group of one (what a world of one "
        "would pay for them); ddp_trainer runs as a pod of one process runs it, and builds "
        "neither.",
        "",
        "| loop | ms a step | images/s | over the bare loop |",
        "| --- | --- | --- | --- |",
        *(
            _floor_row(label, mlp_one[label], mlp_one["bare loop"])
            for label in ("bare loop", "ddp_trainer", "bare loop in DDP", "reference")
        ),
        "",
        "Goal: ddp_trainer within 5% of the bare loop.",
        "",
        "The reference loop (`benchmarks/reference_loop.py`) is the tutorials' DDP loop: a "
        "Dataset normalizing one sample per `__getitem__`, DataLoader with DistributedSampler, "
        "fp32, `loss.item()` after every step; model and data come from ddp_trainer, so only "
        "the loop differs. ddp_trainer keeps the dataset on the device and batches it by index, "
        "reads the loss once per epoch, runs convolutions channels_last, uses "
        "gradient_as_bucket_view, and bf16 autocast where the hardware computes bf16 (the "
        "precision column; its CPU default is fp32).",
        "",
        "GPU figures: the GPU section (`python -m benchmarks gpu`).",
    ]
    raw = {
        "command": COMMAND,
        "repeats": repeats,
        "cpus": cpu_count(),
        "cpu": cpu_model,
        "native_bf16": native_bf16,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load": load,
        "minutes": minutes,
        "images_per_sec": {  # every run's, by measurement and variant
            name: {label: list(rate.samples) for label, rate in rates.items()}
            for name, rates in (
                ("MLP, 2 processes, 2,000 steps", mlp_two),
                ("MLP, 1 process, 2,000 steps", mlp_one),
                ("WRN-10-2, 2 processes", wrn_two),
            )
        },
    }
    return Section("\n".join(lines), raw)


def _floor_row(label: str, rate: Rate, floor: Rate) -> str:
    """One loop's step time (batch 128, one process), throughput and distance to the floor."""
    over = (floor.median / rate.median - 1) * 100
    step_ms = BATCH_SIZE * 1000 / rate.median
    return f"| {label} | {step_ms:.3f} | {rate} | {over:+.1f}% |"
