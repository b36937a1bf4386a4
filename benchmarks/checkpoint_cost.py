"""What checkpoints and the SIGTERM agreement cost training: ddp_trainer under torchrun (2
processes, gloo) with and without them, images/s interleaved as in the trainer benchmark.

- the agreement: one all-reduce of two numbers on a gloo group every step (`--stop-check-steps`
  1, the default) against one every 10^6 steps (never, in these runs);
- saves at the default interval (`--checkpoint-every-seconds` 300: in runs this short, the end
  of each epoch) and at one a second, 300 times as often, whose cost per save, divided by 300 s,
  is the slowdown at the default interval.
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.markdown import Section, raw_note
from benchmarks.trainer import MLP, SHARED, WRN, Rate, Variant, cpu_count, cpu_description, measure

NEVER = "--stop-check-steps=1000000"
DEFAULT_SECONDS = 300  # options.DEFAULT_CHECKPOINT_SECONDS; the benchmark must not import torch
WORKLOADS = {
    "MLP 784-128-64-10": MLP,
    "WRN-10-4": (*WRN, "--wrn-width=4", "--epochs=3"),
}


def run(args: argparse.Namespace) -> Section:
    repeats = 1 if args.quick else args.repeats
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    started = time.time()
    variants = [
        Variant("no checkpoints, no agreement", "ddp_trainer", extra=(NEVER,)),
        Variant("no checkpoints", "ddp_trainer"),
        Variant("default interval", "ddp_trainer", extra=("--checkpoint-dir=checkpoints",)),
        Variant(
            "a save a second",
            "ddp_trainer",
            extra=("--checkpoint-dir=checkpoints", "--checkpoint-every-seconds=1"),
        ),
    ]
    results: dict[str, dict[str, Rate]] = {}
    for name, workload in WORKLOADS.items():
        results[name] = measure(f"checkpoints, {name}", variants, workload, repeats)
    minutes = (time.time() - started) / 60
    cpu_model, _ = cpu_description()
    rows = []
    for name, rates in results.items():
        bare, agreed = rates[variants[0].label], rates[variants[1].label]
        default, often = rates[variants[2].label], rates[variants[3].label]
        per_second_cost = (agreed.median - often.median) / agreed.median
        rows.append(
            f"| {name} | {bare} | {agreed} ({_change(bare, agreed)}) | {default} "
            f"({_change(agreed, default)}) | {often} ({_change(agreed, often)}) "
            f"| {per_second_cost / DEFAULT_SECONDS * 100:+.3f}% |"
        )
    raw = {
        "repeats": repeats,
        "cpus": cpu_count(),
        "cpu": cpu_model,
        "load": load,
        "minutes": minutes,
        "images_per_sec": {  # every run's, by workload and variant
            name: {label: list(rate.samples) for label, rate in rates.items()}
            for name, rates in results.items()
        },
    }
    text = "\n".join(
        [
            "## Checkpoints and SIGTERM",
            "",
            f"Command: `python -m benchmarks checkpoint` (part of `make bench`). "
            f"{raw_note('checkpoint')}",
            "",
            f"Machine: {cpu_count()} CPUs, {cpu_model}, no GPU. Load average {load:.1f} at the "
            f"start (shared machine: noisy). The run took {minutes:.1f} minutes.",
            "",
            "Training images/s over both ranks (torchrun, 2 processes, gloo, "
            f"{' '.join(SHARED[1:3])}), median (lowest-highest) of {repeats} interleaved runs, "
            "and the change against the column to its left (the agreement) or against "
            "`no checkpoints` (the saves). The last column is the save-a-second slowdown "
            f"divided by {DEFAULT_SECONDS}: the cost of the default interval, "
            f"`checkpointEverySeconds` {DEFAULT_SECONDS}.",
            "",
            "| model | no checkpoints, no SIGTERM agreement | no checkpoints (agreement every "
            "step) | default interval | a save a second | slowdown at the default interval |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "Rank 0 copies the state to CPU memory on the training thread and serialises and "
            "writes it in a background thread; the other rank does nothing for a save. The "
            "agreement is one gloo all-reduce of two floats per step over loopback, on a "
            "two-core machine that already runs both ranks' computation.",
        ]
    )
    return Section(text, raw)


def _change(before: Rate, after: Rate) -> str:
    return f"{(after.median - before.median) / before.median * 100:+.1f}%"
