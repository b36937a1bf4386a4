"""The operator benchmark's section of docs/BENCHMARKS.md, in Markdown, from the results
`operator_measure.measure` returns (the prose around it is the document's own)."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.markdown import raw_note
from benchmarks.operator_measure import REPO, Sizes

DOCS = REPO / "docs"
DOCUMENT = DOCS / "BENCHMARKS.md"
PLOT_LATENCY = DOCS / "benchmarks-operator-latency.png"
PLOT_SCALE = DOCS / "benchmarks-operator-memory.png"


def _cells(values: dict[str, float | None], keys: list[str], fmt: Callable[[float], str]) -> str:
    """kube-ddp's value, then each peer's value and the ratio kube-ddp / peer."""
    ours = values.get("kube-ddp")
    cells = [fmt(ours) if ours is not None else "-"]
    for key in keys[1:]:
        theirs = values.get(key)
        cells.append(fmt(theirs) if theirs is not None else "not run")
        ratio = f"{ours / theirs:.2f}x" if ours is not None and theirs else "-"
        cells.append(ratio)
    return " | ".join(cells)


def _header(first: str, results: dict[str, Any]) -> list[str]:
    titles = list(results["contenders"].values())
    columns = [first, titles[0]]
    for title in titles[1:]:
        columns += [title, "ratio"]
    return ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]


def seconds(value: float) -> str:
    return f"{value:.3g} s"


def render(results: dict[str, Any], sizes: Sizes, command: str) -> str:
    keys = list(results["contenders"])
    load = results["load"]
    lines = [
        "## Operator, side by side with Kubeflow's controllers",
        "",
        f"Command: `{command}`. Results of one run ({results['minutes']:.0f} min).",
        raw_note("operator"),
        *([results["note"]] if results.get("note") else []),  # where stages come from elsewhere
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {cpu_model()}, "
        f"{_memory_gib():.0f} GiB; Python {platform.python_version()}. The control plane",
        "(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok), the controller",
        "under test and the benchmark client share these cores, and other work ran on the machine",
        f"at the same time: load average (1 min) at the start of each stage {min(load):.1f} to "
        f"{max(load):.1f}, median {statistics.median(load):.1f}. Figures are noisy; the ratios,",
        "taken minutes apart under the same conditions, say more than the absolute times.",
        "",
        "How: each stage runs each controller in turn, kube-ddp first (last in the scale stage),",
        "each in a fresh namespace",
        "that only it watches, with its controller just started (one controller at a time);",
        "times are taken by the client from watch events. Controllers: "
        + ", ".join(results["contenders"].values())
        + " (benchmarks/contenders.py says which job each runs and with which flags).",
        "The floor is no controller: the benchmark's client creates the objects kube-ddp's",
        "builders render for each job (its Service, NetworkPolicy, ServiceAccount, Role,",
        "RoleBinding and pods) itself, as fast as the API server takes them; it runs the apply",
        "and burst stages, and its ratio is kube-ddp's figure over the floor's.",
        "",
    ]
    apply_rows = []
    for workers in sizes.apply_workers:
        found = results.get(f"apply{workers}")
        if not found:
            continue
        for label, field_ in (("p50", "p50_s"), ("p99", "p99_s")):
            values = {k: v[field_] for k, v in found.items()}
            apply_rows.append(f"| {workers} workers, {label} | {_cells(values, keys, seconds)} |")
        spread = {k: f"{v['min_s']:.3g}-{v['max_s']:.3g} s" for k, v in found.items()}
        apply_rows.append(
            f"| {workers} workers, min-max | "
            + " | ".join(
                [spread["kube-ddp"], *(x for k in keys[1:] for x in (spread.get(k, "-"), ""))]
            )
            + " |"
        )
    if apply_rows:
        lines += [
            f"### Apply -> all worker pods exist ({sizes.apply_jobs} jobs in a row, after one "
            "warm-up job)",
            "",
            *_header("jobs of", results),
            *apply_rows,
            "",
            f"![apply latency]({PLOT_LATENCY.name})",
            "",
        ]
    burst_rows = []
    for jobs in sizes.bursts:
        found = results.get(f"burst{jobs}")
        if found:
            values = {k: v["all_pods_s"] for k, v in found.items()}
            burst_rows.append(
                f"| {jobs:,} x {sizes.burst_workers} | {_cells(values, keys, seconds)} |"
            )
    if burst_rows:
        calls = "; ".join(
            f"{results['contenders'][k]} {v['create_calls_s']:.3g} s"
            for jobs in sizes.bursts
            for k, v in results.get(f"burst{jobs}", {}).items()
            if jobs == max(sizes.bursts)
        )
        lines += [
            "### Burst: jobs created at once (8 client threads) -> all worker pods exist",
            "",
            *_header("jobs x workers", results),
            *burst_rows,
            "",
            f"The create calls themselves ({max(sizes.bursts):,} jobs): {calls}.",
            "",
        ]
    completion = results.get("completion")
    if completion:
        lines += [
            f"### The last pod Succeeded -> job Succeeded ({sizes.completion_jobs} jobs of 2 "
            "workers, ended one at a time)",
            "",
            "The pod whose exit ends the job: kube-ddp's worker 0, the MPIJob's launcher, the",
            "PyTorchJob's master; a TrainJob's JobSet succeeds when every pod has, so both of its",
            "pods end, at once, and the time runs from the later one.",
            "",
            *_header("", results),
        ]
        for label, field_ in (("p50", "p50_s"), ("p99", "p99_s")):
            values = {k: v[field_] for k, v in completion.items()}
            lines.append(f"| {label} | {_cells(values, keys, seconds)} |")
        lines += ["", *_requests_section(results, completion, keys, sizes)]
    scale = results.get("scale")
    if scale:
        lines += [*_scale_section(results, scale, keys)]
    return "\n".join(lines)


def _requests_section(
    results: dict[str, Any], completion: dict[str, Any], keys: list[str], sizes: Sizes
) -> list[str]:
    per_job = {k: v["requests_per_job"] for k, v in completion.items()}
    totals = {k: sum(v.values()) for k, v in per_job.items()}
    writes = {
        k: sum(c for name, c in v.items() if name.split()[0] not in ("GET", "LIST", "WATCH"))
        for k, v in per_job.items()
    }
    rows = _visible({name for v in per_job.values() for name in v}, per_job, 0.5)
    lines = [
        "### API server requests per job lifecycle",
        "",
        f"apiserver_request_total read before and after the {sizes.completion_jobs} jobs above",
        "went create -> Running -> Succeeded -> deleted, pods gone; less the benchmark client's",
        "own requests (it counts them) and the rate of the same controller idling for "
        f"{sizes.idle_s:g} s before",
        "(leases, heartbeats); divided by the jobs. The metric has no client label: the figures",
        "are all that a job's lifecycle cost the API server with this controller, its own",
        "requests and those of the scheduler, kwok and the controller manager (Job controller,",
        "garbage collector) caused by the objects it made.",
        "",
        *_header("requests per job", results),
        f"| all | {_cells(totals, keys, lambda x: f'{x:.1f}')} |",
        f"| writes (not GET, LIST, WATCH) | {_cells(writes, keys, lambda x: f'{x:.1f}')} |",
    ]
    for name in rows:
        values = {k: v.get(name, 0.0) for k, v in per_job.items()}
        lines.append(f"| {name} | {_cells(values, keys, lambda x: f'{x:.1f}')} |")
    lines += [
        "",
        "Rows under 0.5 for every controller are left out (the totals keep them); what is left",
        "of the idle rate after the subtraction is noise of either sign.",
        "",
    ]
    return lines


def _visible(names: set[str], counts: dict[str, dict[str, float]], least: float) -> list[str]:
    """The rows some contender has at least `least` of (what is left of the idle rate's
    subtraction is noise of either sign)."""
    return sorted(n for n in names if max(abs(c.get(n, 0.0)) for c in counts.values()) >= least)


def _scale_section(results: dict[str, Any], scale: dict[str, Any], keys: list[str]) -> list[str]:
    sizes_seen = sorted({p["jobs"] for v in scale.values() for p in v["scale"]})
    lines = [
        "### Controller memory and CPU with many jobs",
        "",
        "Jobs of one worker (an MPIJob: one worker and its launcher), created 8 at a time, "
        "whose pods",
        "stay Running on kwok nodes; the controller's resident memory (VmRSS) 5 s after the last",
        "pod ran, and the CPU seconds it used to get there (from its start, which for kube-ddp",
        "includes about a second of Python imports; for the larger size, from the smaller one,",
        "by the controller restarted in between). Trainer v2 is two controllers, the Trainer and",
        "JobSet (a TrainJob makes a JobSet, which makes a batch Job): both processes are summed,",
        "the Job controller's share of the controller manager is not counted for anyone.",
        "",
        *_header("", results),
    ]
    for jobs in sizes_seen:
        point = {
            k: next((p for p in v["scale"] if p["jobs"] == jobs), None) for k, v in scale.items()
        }
        rss = {k: p["rss_mib"] if p else None for k, p in point.items()}
        cpu = {k: p["cpu_s"] if p else None for k, p in point.items()}
        wall = {k: p["wall_s"] if p else None for k, p in point.items()}
        lines += [
            f"| {jobs:,} jobs: RSS | {_cells(rss, keys, lambda x: f'{x:.0f} MiB')} |",
            f"| {jobs:,} jobs: CPU seconds | {_cells(cpu, keys, lambda x: f'{x:.1f} s')} |",
            f"| {jobs:,} jobs: wall time to all Running | {_cells(wall, keys, seconds)} |",
        ]
    restart = {k: v["restart"] for k, v in scale.items() if "restart" in v}
    if not restart:
        return lines
    jobs = next(iter(restart.values()))["jobs"]
    lines += [
        "",
        f"![memory vs jobs]({PLOT_SCALE.name})",
        "",
        f"### Restart with {jobs:,} live jobs",
        "",
        "The controller stopped (SIGTERM) and started again; time from the new process's start",
        "until it had reconciled every job (kube-ddp: `kubeddp_jobs_synced_total`; MPI Operator:",
        "distinct jobs in its `Finished syncing job` log lines; Training Operator and Trainer v2:",
        "`controller_runtime_reconcile_total` successes (the Trainer's TrainJob controller), which",
        "counts reconciles, not distinct jobs),",
        "and the API requests of that window (less the idle rate, without a controller).",
        "",
        *_header("", results),
        f"| re-sync time | {_cells({k: v['resync_s'] for k, v in restart.items()}, keys, seconds)}"
        " |",
        "| API requests | "
        + _cells(
            {k: sum(v["requests"].values()) for k, v in restart.items()}, keys, lambda x: f"{x:.0f}"
        )
        + " |",
    ]
    rows = _visible(
        {name for v in restart.values() for name in v["requests"]},
        {k: v["requests"] for k, v in restart.items()},
        5,
    )
    for name in rows:
        values = {k: v["requests"].get(name, 0.0) for k, v in restart.items()}
        lines.append(f"| {name} | {_cells(values, keys, lambda x: f'{x:.0f}')} |")
    lines.append("")
    return lines


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"
