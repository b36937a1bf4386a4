"""GPU benchmark: ddp_trainer against the tutorials' DDP loop and the bare loop on one GPU, and
torch.compile's gain and compile time.

Two workloads of the seed's shapes on synthetic data: ResNet-18 (CIFAR variant) on 3x32x32 and
WRN-16-4 on 1x28x28 (Fashion-MNIST's). Each figure is the median of --repeats interleaved runs
(images/s of the epochs after the first, as the runs report it); --compile runs once per
workload, its first epoch (which compiles) timed beside the uncompiled one. The raw results of
every run are written beside the section (RAW) as each run ends, so prose about them can be
checked, and a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.markdown import Section, raw_note, raw_path
from benchmarks.trainer import SHARED, Variant, cpu_count, cpu_description

RAW = raw_path("gpu")
# Where the run writes its raw results as it goes (benchmarks/gpu_run.sh: its $OUT).
RAW_ENV = "GPU_BENCH_RAW"
# `--device cpu`: the same script end to end on a CPU, small enough to finish in a minute or two.
DRY_RUN = ("--device=cpu", "--synthetic-samples=384", "--epochs=2")
COMMAND = "python -m benchmarks gpu"
RUN_TIMEOUT_S = 240
SAMPLES = 12_800
RESNET = ("--model=resnet18", "--synthetic-shape=3x32x32", f"--synthetic-samples={SAMPLES}")
WRN = (
    "--model=wide-resnet",
    "--wrn-depth=16",
    "--wrn-width=4",
    "--synthetic-shape=1x28x28",
    f"--synthetic-samples={SAMPLES}",
)
EPOCHS = "--epochs=3"
# The seed's table: CIFAR-10 (50,000 training images), 32 epochs, ResNet-18 on ThetaGPU A100s.
SEED_IMAGES, SEED_EPOCHS = 50_000, 32
SEED_SECONDS = {"one A100": 522.3, "eight A100s": 73.5}

OURS = Variant("ddp_trainer", "ddp_trainer", 1)
REFERENCE = Variant("reference", "benchmarks.reference_loop", 1)
BARE = Variant("bare loop", "benchmarks.bare_loop", 1, torchrun=False)
COMPILED = Variant("ddp_trainer --compile", "ddp_trainer", 1, extra=("--compile",))


def one_run(variant: Variant, workload: tuple[str, ...]) -> dict[str, Any]:
    """What the run reports (its summary, or the reference loop's line) and its wall time."""
    started = time.perf_counter()
    result = variant.result(workload, timeout_s=RUN_TIMEOUT_S)
    result["wall_seconds"] = time.perf_counter() - started
    result["variant"] = variant.label
    print(
        f"  {variant.label}: {result['images_per_sec']:,.0f} img/s, "
        f"{result['wall_seconds']:.1f} s wall",
        file=sys.stderr,
    )
    return result


def measure(
    workload: tuple[str, ...], repeats: int, compiled: bool = True
) -> Iterator[dict[str, Any]]:
    """Each run's result as it ends: the variants interleaved, then one compiled run."""
    for _ in range(repeats):
        for variant in (OURS, REFERENCE, BARE):
            yield one_run(variant, workload)
    if compiled:
        yield one_run(COMPILED, workload)


def median(runs: list[dict[str, Any]], label: str, key: str = "images_per_sec") -> float:
    values = [run[key] for run in runs if run["variant"] == label and run.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def spread(runs: list[dict[str, Any]], label: str) -> str:
    values = [run["images_per_sec"] for run in runs if run["variant"] == label]
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:,.0f}"
    return f"{middle:,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def render(raw: dict[str, Any]) -> str:
    """The section, from the raw results alone."""
    workloads = raw["workloads"]
    lines = [
        "## GPU",
        "",
        f"Command: `{COMMAND}` (on a machine with CUDA; `benchmarks/gpu_run.sh` runs it with "
        f"the CUDA tests where the trainer's dependencies must be carried; `DEVICE=cpu` runs "
        f"the same script as a dry run on a CPU). {raw_note('gpu')}",
        "",
        f"Machine: {raw['device']}, driver {raw['driver']}, CUDA {raw['cuda']}, torch "
        f"{raw['torch']}, Python {raw['python']}, {raw['cpus']} CPUs. The run took "
        f"{raw.get('minutes', 0):.1f} minutes.",
        "",
        f"One process, synthetic data of each shape ({SAMPLES:,} images, 3 epochs, the first "
        "excluded), batch size 128, SGD with momentum. ddp_trainer with its defaults "
        "(precision auto, the data on the device, channels_last convolutions) as a pod of one "
        "process runs it (no process group, no DDP); the bare loop (`benchmarks/bare_loop.py`: "
        "forward, loss, backward, SGD, fp32, nothing read back) is the floor; the reference "
        "loop is the DDP tutorial's (a pinned DataLoader, fp32, "
        f"`.to(device)` per batch, `loss.item()` per step). Median (lowest-highest) of "
        f"{raw['repeats']} interleaved runs, images/s.",
        "",
        "| model | ddp_trainer | reference loop | speed-up | bare loop | ddp_trainer over it | "
        "peak memory ours / reference |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in workloads.items():
        ours, reference = median(runs, OURS.label), median(runs, REFERENCE.label)
        bare = median(runs, BARE.label)
        memory = (
            f"{median(runs, OURS.label, 'peak_device_memory_mib'):,.0f} / "
            f"{median(runs, REFERENCE.label, 'peak_device_memory_mib'):,.0f} MiB"
        )
        lines.append(
            f"| {name} | {spread(runs, OURS.label)} | {spread(runs, REFERENCE.label)} "
            f"| {ours / reference:.1f}x | {spread(runs, BARE.label)} "
            f"| {(bare - ours) / bare * 100:+.1f}% | {memory} |"
        )
    lines += [
        "",
        "Goals: at least 3x the reference loop's images/s; within 5% of the bare loop (ahead of "
        "it where bf16 and channels_last pay).",
    ]
    compiled_runs = any(run["variant"] == COMPILED.label for r in workloads.values() for run in r)
    if compiled_runs:
        lines += compile_table(workloads)
    if raw.get("dry_run"):
        lines += [
            "",
            f"A dry run (`--device cpu`, {' '.join(DRY_RUN[1:])}): these figures say only that "
            "the script runs end to end, not how fast a GPU trains.",
        ]
    resnet = workloads.get("ResNet-18, 3x32x32")
    if resnet and not raw.get("dry_run"):
        rate = median(resnet, OURS.label)
        ours_seconds = SEED_IMAGES * SEED_EPOCHS / rate
        lines += [
            "",
            f"The seed's table in our terms: {SEED_EPOCHS} epochs of {SEED_IMAGES:,} "
            f"CIFAR-10-shaped images at ddp_trainer's ResNet-18 rate on one {raw['device']} "
            f"take {ours_seconds:.0f} s of training (evaluation and start-up excluded): "
            + ", ".join(
                f"{seconds / ours_seconds:.2f}x the speed of the seed's {seconds} s on {where}"
                for where, seconds in SEED_SECONDS.items()
            )
            + " (ThetaGPU; a different GPU, data loaded from files, its own loop).",
        ]
    return "\n".join(lines)


def compile_table(workloads: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "",
        "torch.compile (one run each, `--compile` against the median uncompiled run):",
        "",
        "| model | images/s compiled | gain | first epoch compiled | first epoch uncompiled |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, runs in workloads.items():
        compiled, ours = median(runs, COMPILED.label), median(runs, OURS.label)
        lines.append(
            f"| {name} | {compiled:,.0f} | {(compiled - ours) / ours * 100:+.1f}% "
            f"| {median(runs, COMPILED.label, 'first_epoch_seconds'):.1f} s "
            f"| {median(runs, OURS.label, 'first_epoch_seconds'):.1f} s |"
        )
    return lines


def machine(device: str) -> dict[str, Any]:
    import torch

    if device == "cpu":
        return {
            "device": f"CPU dry run ({cpu_description()[0]})",
            "driver": "none",
            "cuda": None,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpus": cpu_count(),
        }
    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "device": torch.cuda.get_device_name(0),
        "driver": driver or "unknown",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
    }


def run(args: argparse.Namespace) -> Section:
    import torch

    dry_run = args.device == "cpu"
    if not dry_run and not torch.cuda.is_available():
        print("gpu benchmark: no GPU here, its section is kept as it is", file=sys.stderr)
        return Section("")
    repeats = 1 if args.quick or dry_run else args.repeats
    where = Path(os.environ.get(RAW_ENV) or RAW)
    if dry_run and where == RAW:
        raise SystemExit(f"gpu benchmark: a dry run writes no docs: set {RAW_ENV}=<file>")
    started = time.time()
    raw: dict[str, Any] = {
        **machine(args.device),
        "repeats": repeats,
        "shared_args": list(SHARED),
        "dry_run": dry_run,
    }
    raw["workloads"] = {}
    for name, workload in (("ResNet-18, 3x32x32", RESNET), ("WRN-16-4, 1x28x28", WRN)):
        print(f"gpu benchmark: {name}", file=sys.stderr)
        raw["workloads"][name] = runs = []
        sized = (*workload, *DRY_RUN) if dry_run else (*workload, EPOCHS)
        for result in measure(sized, repeats, compiled=not dry_run):
            runs.append(result)
            raw["minutes"] = (time.time() - started) / 60
            if not args.quick:  # after every run: a run cut short keeps what it measured
                where.write_text(json.dumps(raw, indent=1) + "\n")
    return Section(render(raw), raw if not dry_run else {})
