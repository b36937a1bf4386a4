"""The run's curve as a picture: in the terminal (plotext) and as a PNG (matplotlib).

Drawn from `status.trainingHistory`: loss and validation loss on the left axis, validation
accuracy on the right one, by epoch, a vertical line where the group restarted (heavy) or was
preempted (dotted), and a key below. Both libraries are the `plot` extra of kube-ddp
(`pip install 'kube-ddp[plot]'`), imported only here and only when a picture is asked for: the
operator's image has neither, and without them `describe` and `run --local` say how to get
the picture in one line.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from kube_ddp.api import TrainingHistory

INSTALL_HINT = "pip install 'kube-ddp[plot]'"
WIDTH, HEIGHT = 100, 20  # the terminal plot's largest size, in characters
# Each curve's look, whichever others the history has: its marker in the terminal, its line
# and color in the PNG.
MARKERS = {"loss": "•", "val-loss": "x", "val-acc": "+"}
LINES = {
    "loss": ("o-", "tab:blue"),
    "val-loss": ("s--", "tab:orange"),
    "val-acc": ("^-", "tab:green"),
}


class PlotUnavailableError(Exception):
    """No picture can be made (the plot extra is missing, or no epoch has ended): why, in one
    line."""


@dataclass(frozen=True)
class Series:
    label: str
    epochs: list[int]
    values: list[float]
    right: bool  # on the right-hand axis (accuracy, 0-1)


def series(history: TrainingHistory) -> list[Series]:
    """The curves the history holds: loss, val-loss and val-acc, each where it was reported."""
    found = []
    for label, field, right in (
        ("loss", "loss", False),
        ("val-loss", "val_loss", False),
        ("val-acc", "val_accuracy", True),
    ):
        pairs = [(p.epoch, getattr(p, field)) for p in history.points]
        kept = [(epoch, value) for epoch, value in pairs if value is not None]
        if kept:
            found.append(Series(label, [e for e, _ in kept], [v for _, v in kept], right))
    return found


def text(history: TrainingHistory, title: str, width: int = WIDTH, color: bool = False) -> str:
    """The curve drawn in characters, `width` columns at most (colors for a terminal)."""
    try:
        import plotext
    except ImportError:
        raise PlotUnavailableError(f"for the training curve: {INSTALL_HINT}") from None
    figure = plotext.figure
    figure.clear()
    plotext.terminal.limit(False, False)  # the size asked for, whatever the terminal's
    figure.plot_size(max(40, min(width, WIDTH)), HEIGHT)
    figure.theme("simple")  # the terminal's own background; the curves in colors
    curves, key = series(history), []
    # The marks first, so the curves are drawn over them: a vertical run of their character
    # across the left axis's values (the right's where the left has none).
    spanned = [c.values for c in curves if not c.right] or [c.values for c in curves]
    low, high = min(min(v) for v in spanned), max(max(v) for v in spanned)
    for kind, char in (("Restart", "┃"), ("Preemption", "┊")):
        at = [m.epoch for m in history.marks if m.kind == kind]
        side = "left" if any(not c.right for c in curves) else "right"
        for epoch in at:
            figure.draw(figure.segment((epoch, epoch), (low, high), marker=char, yside=side))
        if at:
            key.append(f"{char} {kind.lower()} ({', '.join(f'{e:g}' for e in at)})")
    for each in curves:
        marker, side = MARKERS[each.label], "right" if each.right else "left"
        figure.draw(figure.signal(each.epochs, each.values, marker=marker, yside=side).lines())
    key = [
        *(f"{MARKERS[c.label]} {c.label}" + (" (right)" if c.right else "") for c in curves),
        *key,
    ]
    figure.legend(False)  # the key goes below: a legend box would hide the first epochs
    figure.title(title)
    figure.label("epoch", axis="x")
    figure.label("loss", axis="y")
    figure.label("val-acc", axis="y", side="right")
    drawn: str = figure.build().string(colorless=not color)
    figure.clear()
    lines = [line.rstrip() for line in drawn.rstrip("\n").splitlines()]  # plotext pads them
    return "\n".join([*lines, "    " + "   ".join(key)])


def png(history: TrainingHistory | None, title: str, path: Path) -> None:
    """The same curve as a PNG image at `path`."""
    if history is None or not history.points:
        raise PlotUnavailableError(f"no epoch has ended yet: no curve to write to {path}")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailableError(f"to write {path}: {INSTALL_HINT}") from None
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    left = figure.subplots()
    right = left.twinx()
    handles = []
    for each in series(history):
        axis = right if each.right else left
        style, color = LINES[each.label]
        handles += axis.plot(each.epochs, each.values, style, label=each.label, color=color)
    for kind, style in (("Restart", "-"), ("Preemption", ":")):
        for i, mark in enumerate(m for m in history.marks if m.kind == kind):
            label = kind.lower() if i == 0 else None
            handles.append(left.axvline(mark.epoch, color="tab:red", ls=style, label=label))
    left.set(title=title, xlabel="epoch", ylabel="loss")
    right.set_ylabel("val-acc")
    shown = [h for h in handles if not str(h.get_label()).startswith("_")]
    figure.legend(handles=shown, loc="outside lower center", ncols=len(shown), frameon=False)
    left.grid(alpha=0.3)
    figure.savefig(path, format="png", dpi=100)


def section(history: TrainingHistory | None, title: str, width: int, color: bool) -> str:
    """What `describe` and `run --local` end with: the curve, or why there is none."""
    if history is None or not history.points:
        return "Curve:        no epoch has ended yet"
    try:
        return "Curve:\n" + text(history, title, width, color)
    except PlotUnavailableError as missing:
        return f"Curve:        {missing}"


def can_write_png() -> bool:
    """Whether `png` has its library (checked before a local run starts)."""
    return importlib.util.find_spec("matplotlib") is not None


def show(
    history: TrainingHistory | None, title: str, out: TextIO, err: TextIO, png_path: Path | None
) -> int:
    """The curve's section on `out` (colors when it is a terminal, as wide as that), and the
    PNG at `png_path` when given: 1 when it cannot be written, with why on `err`."""
    width = shutil.get_terminal_size((WIDTH, 24)).columns
    out.write("\n" + section(history, title, width, out.isatty()) + "\n")
    out.flush()
    if png_path is None:
        return 0
    try:
        png(history, title, png_path)
    except PlotUnavailableError as error:
        err.write(f"kube-ddp: {error}\n")
        return 1
    err.write(f"kube-ddp: wrote the training curve to {png_path}\n")
    return 0
