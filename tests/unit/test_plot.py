"""The run's curve drawn: for a terminal (plotext), as a PNG (matplotlib), at the end of
`kube-ddp describe`, and the one line said when the plot extra is not installed."""

from __future__ import annotations

import io
import subprocess
import sys
import tomllib
from pathlib import Path

from kube_ddp import clusterview, plot
from kube_ddp.api import CurveMark, EpochPoint, TrainingHistory
from tests.unit.support import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

HISTORY = TrainingHistory(
    points=[
        EpochPoint(epoch=e, loss=2 / e, val_loss=2.2 / e, val_accuracy=1 - 0.7 / e)
        for e in range(1, 13)
    ],
    marks=[CurveMark(epoch=4.5, kind="Restart"), CurveMark(epoch=8.2, kind="Preemption")],
)


def job_object(history: TrainingHistory | None) -> dict[str, object]:
    status = {"phase": "Running"}
    if history is not None:
        status["trainingHistory"] = history.model_dump(mode="json", by_alias=True)
    return {"metadata": {"name": "digits", "namespace": "team-a"}, "status": status}


def test_the_curve_in_text_has_its_axes_series_and_marks() -> None:
    drawn = plot.text(HISTORY, "team-a/digits", width=90)
    lines = drawn.splitlines()
    assert "team-a/digits" in lines[0]
    assert max(len(line) for line in lines) <= 90
    assert "\033" not in drawn  # no colors unless asked for
    axes = next(line for line in lines if "epoch" in line)
    assert axes.split() == ["loss", "epoch", "val-acc"]
    body = "\n".join(lines[1:-2])
    for marker in ("•", "x", "+", "┃", "┊"):  # loss, val-loss, val-acc, restart, preemption
        assert marker in body, marker
    assert lines[-1].strip().split("   ") == [
        "• loss",
        "x val-loss",
        "+ val-acc (right)",
        "┃ restart (4.5)",
        "┊ preemption (8.2)",
    ]
    assert "12.0" in drawn and "1.0" in drawn  # the epochs on the x axis
    colored = plot.text(HISTORY, "team-a/digits", width=90, color=True)  # for a terminal
    assert "\033[38;5;" in colored and "\033[48;5;" not in colored  # its own background


def test_a_history_of_loss_alone_draws_loss_alone() -> None:
    own = TrainingHistory(points=[EpochPoint(epoch=e, loss=1 / e) for e in (1, 2, 3)])
    drawn = plot.text(own, "own-script", width=60)
    assert drawn.splitlines()[-1].strip() == "• loss"
    assert "restart" not in drawn
    # each curve keeps its own marker whichever others are there
    no_val_loss = TrainingHistory(
        points=[EpochPoint(epoch=e, loss=1 / e, val_accuracy=e / 4) for e in (1, 2, 3)]
    )
    key = plot.text(no_val_loss, "trainer", width=60).splitlines()[-1]
    assert key.strip().split("   ") == ["• loss", "+ val-acc (right)"]


def test_the_png_is_an_image(tmp_path: Path) -> None:
    target = tmp_path / "curve.png"
    plot.png(HISTORY, "team-a/digits", target)
    data = target.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_describe_ends_with_the_curve_and_writes_the_png(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    target = tmp_path / "report.png"
    assert clusterview.write_curve(job_object(HISTORY), target, out, err) == 0
    shown = out.getvalue()
    assert shown.startswith("\nCurve:\n") and "team-a/digits" in shown
    assert "┃ restart (4.5)" in shown
    assert target.read_bytes().startswith(PNG_MAGIC)
    assert f"wrote the training curve to {target}" in err.getvalue()


def test_describe_of_a_job_with_no_epoch_yet_says_so(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert clusterview.write_curve(job_object(None), None, out, err) == 0
    assert out.getvalue() == "\nCurve:        no epoch has ended yet\n"
    target = tmp_path / "none.png"
    assert clusterview.write_curve(job_object(None), target, out, err) == 1
    assert "no curve to write" in err.getvalue() and not target.exists()


def test_without_the_plot_extra_one_line_says_how_to_get_it() -> None:
    """The extra's modules made unimportable, as in the operator's image."""
    script = (
        "import sys; sys.modules['plotext'] = None; sys.modules['matplotlib'] = None\n"
        "from kube_ddp import plot\n"
        "from tests.unit.test_plot import HISTORY\n"
        "print(plot.section(HISTORY, 'x', 80, False)); print(plot.can_write_png())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines() == [
        "Curve:        for the training curve: pip install 'kube-ddp[plot]'",
        "False",
    ]


def test_the_operators_image_does_not_get_the_plot_extra() -> None:
    """The Dockerfile installs the package's dependencies only: the extra stays the CLI's."""
    project = tomllib.loads((REPO / "operator" / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["plot"]
    assert {d.split(">")[0] for d in extra} == {"plotext", "matplotlib"}
    assert not any(d.startswith(("plotext", "matplotlib")) for d in project["dependencies"])
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "['project']['dependencies']" in dockerfile
    assert "--no-deps ./trainer_image ./operator " in dockerfile
    assert not any(word in dockerfile for word in ("[plot]", "plotext", "matplotlib"))
