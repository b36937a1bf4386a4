"""Two kube-ddp shards against one: the same burst of jobs over two namespaces, handled by one
operator process watching both or by one process per namespace (docs/design.md, "Sharding").

Each round creates `--jobs` jobs of WORKERS workers at once from 8 client threads, half in each
of two fresh namespaces, once per layout (the order turned each round): `one`, a single
`kube-ddp operator -n A -n B`; `two`, `kube-ddp operator -n A` and `kube-ddp operator -n B`.
Measured: seconds from the first create to the last worker pod seen, the operator processes'
CPU seconds summed, and their peak RSS summed. Pods are created, not run: the burst is the
controllers' and the API server's work. Medians over the rounds.

    python -m benchmarks shards [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.contenders import OUT, KubeDDP, kube_ddp_operator
from benchmarks.markdown import Section, raw_note
from benchmarks.operator_measure import (
    Bench,
    Watcher,
    apply_our_crd,
    cpu_seconds,
    pod_name,
    rss_mib,
)
from benchmarks.trainer import machine_line
from tests.cluster.support import load_dev_cluster

RESULTS = OUT / "shards.json"
WORKERS = 4
JOBS, QUICK_JOBS = 400, 6
# layout -> (its title, the namespaces of each process, as indices into the round's two)
LAYOUTS: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {
    "one": ("one process, both namespaces", ((0, 1),)),
    "two": ("two processes, one namespace each", ((0,), (1,))),
}


def burst(bench: Bench, layout: str, jobs: int, scratch: Path) -> dict[str, Any]:
    """`jobs` jobs over two fresh namespaces under `layout`'s processes."""
    contender = KubeDDP()
    with contextlib.ExitStack() as stack:
        namespaces = [stack.enter_context(bench.namespace()) for _ in range(2)]
        operators = [
            stack.enter_context(
                kube_ddp_operator(
                    bench.kubeconfig,
                    [namespaces[i] for i in shard],
                    scratch / f"{layout}-{index}.log",
                )
            )
            for index, shard in enumerate(LAYOUTS[layout][1])
        ]
        watchers = [Watcher(bench.core.list_namespaced_pod, n, key=pod_name) for n in namespaces]
        halves = [[f"burst-{i}" for i in range(jobs) if i % 2 == side] for side in (0, 1)]
        wanted = [{p for n in half for p in contender.worker_pods(n, WORKERS)} for half in halves]
        pids = [pid for operator in operators for pid in operator.pids]
        cpu_from = cpu_seconds(pids)
        try:
            start = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:  # both halves at once, 8 clients each
                creating = [
                    pool.submit(bench.create_many, contender, namespace, half, WORKERS)
                    for namespace, half in zip(namespaces, halves, strict=True)
                ]
                for created in creating:
                    created.result()  # a create that failed fails the burst
            for watcher, pods in zip(watchers, wanted, strict=True):
                watcher.wait(pods, timeout=1800)
            seen = [w.first_seen[p] for w, pods in zip(watchers, wanted, strict=True) for p in pods]
            total = max(seen) - start
            cpu = cpu_seconds(pids) - cpu_from
            rss = rss_mib(pids, "VmHWM")
        finally:
            for watcher in watchers:
                watcher.stop()
    return {"layout": layout, "jobs": jobs, "all_pods_s": total, "cpu_s": cpu, "rss_mib": rss}


def measure(repeats: int, jobs: int) -> dict[str, Any]:
    dev_cluster = load_dev_cluster()
    started_here = dev_cluster.running_state() is None
    state = dev_cluster.up(owner="bench")
    scratch = OUT / "shards"
    scratch.mkdir(parents=True, exist_ok=True)
    bench = Bench(str(state["kubeconfig"]), scratch)
    apply_our_crd(bench.kubeconfig)
    results: dict[str, Any] = {"jobs": jobs, "workers": WORKERS, "load": [], "bursts": []}
    started = time.monotonic()
    try:
        burst(bench, "one", min(jobs, 10), scratch)  # warm: the API server's caches
        order = list(LAYOUTS)
        for round_ in range(repeats):
            for layout in order[round_ % 2 :] + order[: round_ % 2]:
                results["load"].append(os.getloadavg()[0])
                found = burst(bench, layout, jobs, scratch)
                results["bursts"].append(found)
                print(f"shards [{round_ + 1}/{repeats}] {layout}: all pods in "
                      f"{found['all_pods_s']:.1f} s, {found['cpu_s']:.1f} CPU-s",
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        bench.api.close()
        if started_here:
            dev_cluster.down()
    results["minutes"] = (time.monotonic() - started) / 60
    return results


def summary(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per layout, the median of its bursts."""
    found = {}
    for layout in LAYOUTS:
        bursts = [b for b in results["bursts"] if b["layout"] == layout]
        if bursts:
            found[layout] = {
                key: statistics.median(b[key] for b in bursts)
                for key in ("all_pods_s", "cpu_s", "rss_mib")
            } | {"bursts": len(bursts)}
    return found


def render(results: dict[str, Any]) -> str:
    found = summary(results)
    one = found.get("one")
    rows = []
    for layout, row in found.items():
        ratio = f"{row['all_pods_s'] / one['all_pods_s']:.2f}" if one else "-"
        rows.append(
            f"| {LAYOUTS[layout][0]} | {row['all_pods_s']:.1f} | {ratio} | {row['cpu_s']:.1f} "
            f"| {row['rss_mib']:.0f} | {row['bursts']:.0f} |"
        )
    return "\n".join(
        [
            "## Two operator shards against one",
            "",
            f"Command: `python -m benchmarks shards` (part of `make bench`). {raw_note('shards')}",
            "",
            machine_line(
                "the dev cluster's control plane on it, the operators beside it",
                results["load"],
                "burst",
                results.get("minutes", 0),
            ),
            "",
            f"Each burst creates {results['jobs']} jobs of {results['workers']} workers at once, "
            "half in each of two fresh namespaces, under one layout, the order turned each "
            "round. All pods: from the first create to the last worker pod seen; the pods are "
            "created, not run (the burst is the operators' and the API server's work). CPU and "
            "peak RSS are summed over the layout's operator processes; docs/design.md, "
            '"Sharding", says how to read them.',
            "",
            "| layout | all pods (s, median) | / one process | operator CPU-s | peak RSS (MiB) "
            "| bursts |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
        ]
    )


def run(args: argparse.Namespace) -> Section:
    """`python -m benchmarks shards`."""
    results = measure(1 if args.quick else args.repeats, QUICK_JOBS if args.quick else JOBS)
    if not args.quick:
        RESULTS.write_text(json.dumps(results, indent=1))
    return Section(render(results), results)
