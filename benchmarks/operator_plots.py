"""The operator benchmark's plots, PNGs next to docs/BENCHMARKS.md (matplotlib: the bench
dependency group)."""

from __future__ import annotations

from typing import Any

from benchmarks.operator_measure import Sizes
from benchmarks.operator_report import PLOT_LATENCY, PLOT_SCALE


def plot(results: dict[str, Any], sizes: Sizes) -> None:
    """The latency distributions and memory against jobs, as PNGs next to BENCHMARKS.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    titles = results["contenders"]
    colors = {key: f"C{i}" for i, key in enumerate(titles)}  # one color per controller
    panels = [w for w in sizes.apply_workers if f"apply{w}" in results]
    if panels:
        figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
        for axis, workers in zip(axes[0], panels, strict=True):
            for key, found in results[f"apply{workers}"].items():
                ordered = sorted(found["samples"])
                fraction = [(i + 1) / len(ordered) for i in range(len(ordered))]
                axis.step(ordered, fraction, where="post", label=titles[key], color=colors[key])
            axis.set_xscale("log")
            axis.xaxis.set_minor_formatter(NullFormatter())
            axis.set_xlabel("apply -> all worker pods exist (s)")
            axis.set_ylabel("fraction of jobs")
            axis.set_title(f"{sizes.apply_jobs} jobs of {workers} workers")
            axis.grid(True, alpha=0.3)
            axis.legend()
        figure.tight_layout()
        figure.savefig(PLOT_LATENCY, dpi=90)
        plt.close(figure)
    if "scale" in results:
        figure, axis = plt.subplots(figsize=(5.5, 3.6))
        for key in titles:
            if key not in results["scale"]:  # the floor: no controller to measure
                continue
            found = results["scale"][key]
            xs = [p["jobs"] for p in found["scale"]]
            ys = [p["rss_mib"] for p in found["scale"]]
            axis.plot(xs, ys, marker="o", label=titles[key], color=colors[key])
        axis.set_xscale("log")
        axis.set_xlabel("jobs with pods Running")
        axis.set_ylabel("controller RSS (MiB)")
        axis.grid(True, alpha=0.3)
        axis.legend()
        figure.tight_layout()
        figure.savefig(PLOT_SCALE, dpi=90)
        plt.close(figure)
