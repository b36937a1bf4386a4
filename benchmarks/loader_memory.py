"""What the DataLoader path costs in memory, for a split over the device budget.

ddp_trainer under torchrun (2 ranks, 2 loader workers each, gloo) trains on MNIST-format files
of synthetic uint8 images whose training split, as float32, is over `batches.DEVICE_BUDGET_BYTES`,
so it goes through the DataLoader. The process tree (torchrun, its ranks, their forkservers and
workers) is sampled every 0.2 s; each process counts its proportional set size (PSS: a shared
page counts a share to each process that maps it), so the sums are what the pod holds:

- per rank: the rank and the workers it started; per pod: the whole tree; the peak of each;
- beside the trainer as it is (`shared`), the same run with the split pickled into each worker
  as an array (`copied`, the DataLoader's way with a numpy dataset), patched in by a
  `sitecustomize` on the run's PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.markdown import Section, raw_note
from benchmarks.trainer import TORCHRUN, cpu_count, cpu_description, trainer_env

# 700,000 28x28 images: 549 MB of uint8, 2.2 GB as float32 (the budget is 2 GiB).
TRAIN_IMAGES = 700_000
WORKERS = 2
RANKS = 2
# Both variants start every process with ddp_trainer.batches (and so torch) imported, so the
# split is all that differs.
SHARED = '''"""ddp_trainer.batches as it is."""
import ddp_trainer.batches
'''
COPIED = '''"""The split pickled into each loader worker as a numpy array."""
import ddp_trainer.batches as batches


class _Copied(batches.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        import numpy as np
        import torch

        return torch.from_numpy(np.ascontiguousarray(self.x[index])), torch.tensor(self.y[index])


batches._Samples = _Copied
'''


def run(args: argparse.Namespace) -> Section:
    repeats = 1 if args.quick else args.repeats
    images = 70_000 if args.quick else TRAIN_IMAGES
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="loader-memory-") as scratch:
        data = Path(scratch) / "data"
        write_mnist_like(data, images)
        patches = {"shared": SHARED, "copied": COPIED}
        for variant, text in patches.items():
            (Path(scratch) / variant).mkdir()
            (Path(scratch) / variant / "sitecustomize.py").write_text(text)
        peaks: dict[str, list[tuple[float, float]]] = {variant: [] for variant in patches}
        for repeat in range(repeats):
            for variant in patches:
                patch = Path(scratch) / variant
                peak = measure(data, patch, Path(scratch) / f"{variant}-{repeat}")
                peaks[variant].append(peak)
                print(
                    f"  [{repeat + 1}/{repeats}] {variant}: rank {peak[0] / 2**20:,.0f} MiB, "
                    f"pod {peak[1] / 2**20:,.0f} MiB",
                    file=sys.stderr,
                )
    minutes = (time.time() - started) / 60
    split = images * 28 * 28
    rows = [
        f"| {variant} | {_mib([p[0] for p in values])} | {_mib([p[1] for p in values])} |"
        for variant, values in peaks.items()
    ]
    shared_pod = statistics.median(p[1] for p in peaks["shared"])
    copied_pod = statistics.median(p[1] for p in peaks["copied"])
    raw = {
        "repeats": repeats,
        "images": images,
        "ranks": RANKS,
        "workers": WORKERS,
        "cpus": cpu_count(),
        "cpu": cpu_description()[0],
        "minutes": minutes,
        "peak_pss_bytes": {  # every run's, by variant
            variant: [{"rank": rank, "pod": pod} for rank, pod in values]
            for variant, values in peaks.items()
        },
    }
    text = "\n".join(
        [
            "## The DataLoader path's memory",
            "",
            "Command: `python -m benchmarks loader-memory` (part of `make bench`). "
            f"{raw_note('loader-memory')}",
            "",
            f"Machine: {cpu_count()} CPUs, {cpu_description()[0]}. The run took {minutes:.1f} "
            f"minutes. {RANKS} ranks under torchrun, {WORKERS} loader workers each "
            f"(`--loader=dataloader`, forkserver), a training split of {images:,} 28x28 uint8 "
            f"images ({split / 2**20:,.0f} MiB; {4 * split / 2**30:.2f} GiB as float32, over "
            "the 2 GiB device budget).",
            "",
            f"Peak PSS, median (lowest-highest) of {repeats} interleaved runs:",
            "",
            "| the split in each worker | per rank (the rank and its workers) | per pod |",
            "| --- | --- | --- |",
            *rows,
            "",
            f"The pod holds {copied_pod / shared_pod:.2f}x the memory when each worker gets a "
            "copy of the split (`copied`) than when the workers map their rank's one copy in "
            "shared memory (`shared`, the trainer's). Each rank still holds one copy of its own: "
            "ranks of one pod do not share theirs.",
        ]
    )
    return Section(text, raw)


def _mib(values: list[float]) -> str:
    middle = statistics.median(values) / 2**20
    if len(values) == 1:
        return f"{middle:,.0f} MiB"
    return f"{middle:,.0f} MiB ({min(values) / 2**20:,.0f}-{max(values) / 2**20:,.0f})"


def write_mnist_like(directory: Path, images: int) -> None:
    """IDX files (the MNIST format ddp_trainer reads) of random images; 1,000 for validation."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, count in (("train", images), ("t10k", 1000)):
        pixels = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, count, dtype=np.uint8)
        header = np.array([0x0803, count, 28, 28], dtype=">u4").tobytes()
        (directory / f"{name}-images-idx3-ubyte").write_bytes(header + pixels.tobytes())
        header = np.array([0x0801, count], dtype=">u4").tobytes()
        (directory / f"{name}-labels-idx1-ubyte").write_bytes(header + labels.tobytes())


def measure(data: Path, patch: Path, workdir: Path) -> tuple[float, float]:
    """Peak PSS of the largest rank with its workers, and of the whole tree, in bytes."""
    workdir.mkdir()
    env = trainer_env(RANKS)
    env["PYTHONPATH"] = os.pathsep.join([str(patch), env["PYTHONPATH"]])
    command = [
        TORCHRUN,
        "--standalone",
        f"--nproc-per-node={RANKS}",
        "-m",
        "ddp_trainer",
        *("--dataset=mnist", f"--data-dir={data}", "--model=mlp", "--epochs=1"),
        *("--loader=dataloader", f"--num-workers={WORKERS}", "--batch-size=512"),
    ]
    process = subprocess.Popen(
        command, env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    peak_rank = peak_pod = 0.0
    while process.poll() is None:
        tree = _tree(process.pid)
        pss = {pid: _pss(pid) for pid in tree}
        peak_pod = max(peak_pod, sum(pss.values()))
        for rank in tree.get(process.pid, []):
            peak_rank = max(peak_rank, sum(pss.get(pid, 0) for pid in _below(tree, rank)))
        time.sleep(0.2)
    _, stderr = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the run failed ({process.returncode}): {stderr.decode()[-2000:]}")
    return peak_rank, peak_pod


def _tree(root: int) -> dict[int, list[int]]:
    """Every process below `root` (and `root`), as parent -> children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    return {pid: children.get(pid, []) for pid in _below(children, root)}


def _below(children: dict[int, list[int]], pid: int) -> list[int]:
    found = [pid]
    for child in children.get(pid, []):
        found += _below(children, child)
    return found


def _pss(pid: int) -> float:
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:  # gone meanwhile
        return 0.0
    return next(
        (float(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:")),
        0.0,
    )
