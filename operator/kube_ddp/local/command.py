"""The `kube-ddp run` subcommand: read and validate the file, then run it locally."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from kube_ddp import plot
from kube_ddp.jobfile import InputError, read_jobs
from kube_ddp.local.plan import LocalRunError, Machine, Overrides
from kube_ddp.local.runner import RunOptions, run_local


def add_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run a job file: --local runs its worker pods as processes on this machine",
        description="Run a DDPTrainingJob file on this machine: the operator's worker pods, "
        "built and decided by the operator's own code, as local processes. Exit codes: 0 "
        "Succeeded, 1 Failed, 2 invalid file or options, 130 interrupted.",
    )
    run.add_argument("file", help="a DDPTrainingJob YAML file (one job), or - for stdin")
    run.add_argument("--local", action="store_true", help="run here (required for now)")
    run.add_argument("-n", "--namespace", help="namespace (default: the file's, or default)")
    run.add_argument("--nodes", type=int, help="worker pods to run instead of spec.nodes")
    run.add_argument(
        "--nproc-per-node",
        type=int,
        help="processes (and GPUs) per worker instead of the spec's",
    )
    run.add_argument(
        "--cpu", action="store_true", help="run on the CPU (gloo) whatever the file asks"
    )
    run.add_argument(
        "--logs", type=Path, metavar="DIR", help="write worker logs to DIR/<pod>-attempt-<n>.log"
    )
    run.add_argument(
        "--grace-period",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL when a worker is stopped (default 10)",
    )
    run.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="also write the training curve to FILE.png"
    )
    run.set_defaults(run=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    if not args.local:
        raise InputError(
            "kube-ddp run: pass --local to run the job on this machine "
            f"(on a cluster: kubectl apply -f {args.file})"
        )
    jobs = read_jobs(args.file, args.namespace)
    if len(jobs) != 1:
        raise InputError(f"{args.file}: holds {len(jobs)} jobs; kube-ddp run takes one")
    for flag, value in (("--nodes", args.nodes), ("--nproc-per-node", args.nproc_per_node)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    if args.plot is not None and not plot.can_write_png():
        raise InputError(f"--plot {args.plot}: {plot.INSTALL_HINT}")
    options = RunOptions(
        overrides=Overrides(nodes=args.nodes, nproc_per_node=args.nproc_per_node, cpu=args.cpu),
        logs_dir=args.logs,
        stop_grace_s=args.grace_period,
        plot_path=args.plot,
        job_dir=None if args.file == "-" else Path(args.file).resolve().parent,
    )
    try:
        return run_local(jobs[0], options, Machine.detect(os.environ))
    except LocalRunError as error:
        raise InputError(f"{args.file}: {error}") from None
