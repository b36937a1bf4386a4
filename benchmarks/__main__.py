"""python -m benchmarks
[trainer|step-profile|checkpoint|work-lost|operator|crd|shards|recovery|loader-memory|gpu|all]
[--peers] [--repeats N] [--quick] [--no-write] [--device cuda|cpu]"""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks.markdown import DOCUMENT, Section, raw_path, write_section

# name -> module of this package, in the order `all` runs them; each section is named after it.
BENCHMARKS = {
    "trainer": "trainer",
    "step-profile": "step_profile",
    "checkpoint": "checkpoint_cost",
    "work-lost": "work_lost",
    "operator": "operator_bench",
    "crd": "crd_cost",
    "shards": "shards",
    "recovery": "recovery",
    "loader-memory": "loader_memory",
    "gpu": "gpu",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("which", nargs="?", default="all", choices=(*BENCHMARKS, "all"))
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="operator: Kubeflow's MPI Operator, Training Operator and Trainer v2 beside kube-ddp",
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs, to try the code")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="gpu: cpu for a dry run of the same script (nothing written but $GPU_BENCH_RAW)",
    )
    parser.add_argument("--no-write", action="store_true", help=f"do not update {DOCUMENT.name}")
    args = parser.parse_args(argv)
    for name in BENCHMARKS if args.which == "all" else (args.which,):
        module = importlib.import_module(f"benchmarks.{BENCHMARKS[name]}")
        section: Section = module.run(args)
        print(section.text)
        # "": nothing measured here; a quick or CPU dry run writes nothing
        if section.text and not args.no_write and not args.quick and args.device != "cpu":
            write_section(DOCUMENT, name, section)
            print(f"benchmarks: wrote the {name} section of {DOCUMENT} and {raw_path(name)}",
                  file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
