"""One training step of the trainer against the bare loop's, op by op (torch.profiler).

Both in this process, a world of one on the CPU, the same MLP, batch and data: the trainer's
own `Recipe.train_epoch` (what a pod of one process runs) and `bare_loop.train_steps`, each
profiled over STEPS steps after an epoch of warm-up. Per step: every aten op's calls and self
time, the time in ops, and the host time outside any op (the Python of each loop), so what the
trainer adds is named, in calls and microseconds. The profiler's own cost falls on both alike;
`benchmarks/trainer.py` gives the unprofiled rates.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.markdown import Section, raw_note
from benchmarks.trainer import BATCH_SIZE, SHARED, cpu_count, cpu_description

COMMAND = "python -m benchmarks step-profile"
STEPS = 500
SAMPLES = STEPS * BATCH_SIZE * 5 // 4  # 80 % of the samples train: STEPS steps an epoch
WORKLOAD = ("--model=mlp", f"--synthetic-samples={SAMPLES}", "--epochs=3")
ROWS = 14  # the ops shown: where the loops differ, then the costliest
ROUNDS = 3  # each loop profiled this many times, interleaved; the quickest round is shown


def profiled(step_all: Callable[[], int]) -> dict[str, Any]:
    """Ops per step of one pass of `step_all` (which returns its steps), and its wall time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as trace:
        started = time.perf_counter()
        steps = step_all()
        wall_us = (time.perf_counter() - started) * 1e6
    ops = {
        event.key: {
            "calls": event.count / steps,
            "self_us": event.self_cpu_time_total / steps,
        }
        for event in trace.key_averages()
        if event.key.startswith("aten::")
    }
    in_ops = sum(event.self_cpu_time_total for event in trace.key_averages()) / steps
    return {"steps": steps, "wall_us": wall_us / steps, "in_ops_us": in_ops, "ops": ops}


def trainer_pass() -> Callable[[], int]:
    """The trainer as one plain process: set up, one epoch of warm-up, then an epoch to run."""
    from ddp_trainer.batches import train_shard
    from ddp_trainer.options import parse_argv
    from ddp_trainer.train import Recipe

    options = parse_argv([*SHARED, *WORKLOAD, "--no-report-progress"], prog="step-profile")
    recipe = Recipe(options)
    recipe.setup()

    def epoch(number: int) -> int:
        shard = train_shard(recipe.train_size, 0, 1, number, options.seed)
        recipe.train_epoch(number, recipe.train_batches(shard))
        return recipe.steps_per_epoch

    epoch(1)
    return lambda: epoch(2)


def bare_pass() -> Callable[[], int]:
    """The bare loop on the same data and model, warmed up the same way."""
    import torch

    from benchmarks.bare_loop import setup, train_steps
    from ddp_trainer.options import parse_argv

    options = parse_argv([*SHARED, *WORKLOAD], prog="step-profile")
    model, optimizer, x, y = setup(options, torch.device("cpu"))

    def epoch() -> int:
        return train_steps(model, optimizer, x, y, torch.randperm(len(y)), options.batch_size)

    epoch()
    return epoch


def run(args: argparse.Namespace) -> Section:
    import torch

    torch.set_num_threads(cpu_count())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print("step profile: the trainer and the bare loop, interleaved", file=sys.stderr)
    passes = {"trainer": trainer_pass(), "bare loop": bare_pass()}
    rounds = [{name: profiled(run) for name, run in passes.items()} for _ in range(ROUNDS)]
    # The round of each loop least disturbed by other work on the machine.
    trainer, bare = (
        min((one[name] for one in rounds), key=lambda side: side["wall_us"]) for name in passes
    )
    raw = {
        "command": COMMAND,
        "cpus": cpu_count(),
        "cpu": cpu_description()[0],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load": load,
        "steps": STEPS,
        "trainer": trainer,
        "bare loop": bare,
    }
    return Section(render(raw), raw)


def render(raw: dict[str, Any]) -> str:
    trainer, bare = raw["trainer"], raw["bare loop"]
    names = set(trainer["ops"]) | set(bare["ops"])

    def of(side: dict[str, Any], name: str, key: str) -> float:
        return float(side["ops"].get(name, {}).get(key, 0.0))

    differ = sorted(
        (
            name
            for name in names
            if abs(of(trainer, name, "calls") - of(bare, name, "calls")) > 0.01
        ),
        key=lambda name: -of(trainer, name, "self_us"),
    )
    costly = sorted(names - set(differ), key=lambda name: -of(trainer, name, "self_us"))
    shown = (differ + costly)[:ROWS]
    calls = [sum(side["ops"][name]["calls"] for name in side["ops"]) for side in (trainer, bare)]
    outside = [side["wall_us"] - side["in_ops_us"] for side in (trainer, bare)]
    lines = [
        "## One step, op by op",
        "",
        f"Command: `{COMMAND}`. {raw_note('step-profile')}",
        "",
        f"Machine: {raw['cpus']} CPUs, {raw['cpu']}; torch {raw['torch']}, Python "
        f"{raw['python']}; load average {raw['load']:.1f} at the start.",
        "",
        f"torch.profiler over {raw['steps']} steps of each loop in one process after an epoch "
        f"of warm-up, the quickest of {ROUNDS} interleaved rounds each: the MLP "
        "784-128-64-10, batch 128, fp32, SGD with momentum, the data in memory. The trainer "
        "is `Recipe.train_epoch` as a pod of one process runs it (no group, no DDP); the bare "
        "loop is `benchmarks/bare_loop.py`'s step. Per step, profiled (the profiler's own "
        "cost is in both):",
        "",
        "| per step | ddp_trainer | bare loop |",
        "| --- | --- | --- |",
        f"| wall time | {trainer['wall_us']:.0f} us | {bare['wall_us']:.0f} us |",
        f"| in aten ops | {trainer['in_ops_us']:.0f} us | {bare['in_ops_us']:.0f} us |",
        f"| host time outside ops (each loop's Python) | {outside[0]:.0f} us "
        f"| {outside[1]:.0f} us |",
        f"| aten op calls | {calls[0]:.1f} | {calls[1]:.1f} |",
        "",
        "The ops where the two differ, then the costliest of the rest (calls and self time per "
        "step):",
        "",
        "| op | calls, ddp_trainer | calls, bare | self us, ddp_trainer | self us, bare |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| `{name}` | {of(trainer, name, 'calls'):.2f} | {of(bare, name, 'calls'):.2f} "
            f"| {of(trainer, name, 'self_us'):.1f} | {of(bare, name, 'self_us'):.1f} |"
            for name in shown
        ),
    ]
    return "\n".join(lines)
