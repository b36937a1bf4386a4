"""Operator benchmark: kube-ddp and Kubeflow's controllers (benchmarks/contenders.py) side by
side on the local control plane (hack/dev-cluster.py: real kube-apiserver, etcd, scheduler,
controller manager, kwok nodes), in one run. Each stage runs each contender in turn, in a fresh
namespace with its controller just started and watching only that namespace; one controller
runs at a time, so the API server's own request counters are the contender's (and what its
objects cost the scheduler, kwok and the controller manager).

  apply       create a job, time until all of its worker pods exist (sequential; 2 and 8 workers)
  burst       N jobs x 4 workers created at once, time until all pods exist (N = 200, 1,000)
  completion  the pod whose exit ends the job Succeeded (pod watch) -> job Succeeded (job watch)
  lifecycle   API server requests per job: create -> running -> succeeded -> deleted, gone
  scale       controller RSS and CPU seconds with 1,000 (and 10,000) jobs' pods Running
  restart     the controller stopped and started with those 1,000 jobs live: time until it
              reconciled every one, and the API requests that cost

Times are taken by the client from watch events (time.perf_counter).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from benchmarks.contenders import CONTENDERS, OUT
from benchmarks.markdown import Section, write_section
from benchmarks.operator_measure import QUICK, STAGES, Sizes, measure
from benchmarks.operator_plots import plot
from benchmarks.operator_report import DOCUMENT, render


def run(args: argparse.Namespace) -> Section:
    """`python -m benchmarks operator [--peers]`: measure, plot, and the markdown section."""
    sizes = QUICK if args.quick else Sizes()
    chosen = list(CONTENDERS.values()) if args.peers else [CONTENDERS["kube-ddp"]]
    results = measure(OUT, sizes, chosen)
    command = "python -m benchmarks operator" + (
        " --peers (the operator part of `make bench`)" if args.peers else ""
    )
    results["command"] = command
    (OUT / "results.json").write_text(json.dumps(results, indent=1))
    if not args.quick and not args.no_write:
        plot(results, sizes)
    return Section(render(results, sizes, command), results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--stage", action="append", choices=STAGES, help="default: all")
    parser.add_argument("--contender", action="append", choices=list(CONTENDERS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--scale-jobs",
        type=int,
        action="append",
        metavar="N",
        help="the scale stage's sizes (default: 1,000 for all and 10,000 for kube-ddp)",
    )
    parser.add_argument("--note", help="a sentence for the section, on where figures come from")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS",
        help="measure nothing: write the section of docs/BENCHMARKS.md, its raw results and "
        "the plots from a results.json of an earlier run",
    )
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads(args.render.read_text())
        sizes = Sizes(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in results["sizes"].items()}
        )
        plot(results, sizes)
        section = Section(render(results, sizes, results["command"]), results)
        write_section(DOCUMENT, "operator", section)
        return 0
    sizes = QUICK if args.quick else Sizes()
    if args.scale_jobs:
        upto = min(sizes.scale_peers_upto, max(args.scale_jobs))
        sizes = dataclasses.replace(sizes, scale_jobs=tuple(args.scale_jobs), scale_peers_upto=upto)
    chosen = [CONTENDERS[k] for k in args.contender or CONTENDERS]
    results = measure(args.out, sizes, chosen, tuple(args.stage or STAGES))
    results["command"] = "python -m benchmarks.operator_bench " + " ".join(argv or sys.argv[1:])
    if args.note:
        results["note"] = args.note
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(render(results, sizes, results["command"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
