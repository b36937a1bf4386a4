"""The recovery benchmark's arithmetic and report (benchmarks/recovery.py): worker-seconds lost,
medians per cell, a run that never trained again said as such."""

from __future__ import annotations

from dataclasses import asdict

from benchmarks.recovery import CONTESTANTS, FAULTS, Outcome, render


def test_worker_seconds_count_the_wait_and_the_steps_redone_on_every_worker() -> None:
    outcome = Outcome("recreate", "crash", workers=2, back_s=10.0, reached=40, resumed=30,
                      step_s=0.5)  # fmt: skip
    assert outcome.redone == 10
    assert outcome.worker_seconds == 2 * (10.0 + 10 * 0.5)


def test_a_run_that_never_trained_again_has_no_worker_seconds() -> None:
    outcome = Outcome("exitcode", "crash", workers=2, error="the job Failed")
    assert outcome.redone is None and outcome.worker_seconds is None


def test_the_report_gives_medians_and_says_the_runs_not_back() -> None:
    back = [Outcome("recreate", "crash", 2, back_s=s, reached=9, resumed=8, step_s=0.1)
            for s in (12.0, 20.0, 14.0)]  # fmt: skip
    failed = Outcome("exitcode", "crash", 2, error="the job Failed: master-0 Failed exit 1")
    text = render({"outcomes": [asdict(o) for o in [*back, failed]], "load": [1.0, 3.0]})
    cells = text.splitlines()
    rows = {tuple(line[2:].split(" | ")[:2]): line for line in cells if line.startswith("| ")}
    crash = FAULTS["crash"]
    assert "| 14.0 (12.0-20.0) |" in rows[crash, CONTESTANTS["recreate"].title]
    assert "1 of 1 not back (first: the job Failed" in rows[crash, CONTESTANTS["exitcode"].title]
    assert "not in this run" in rows[crash, CONTESTANTS["inplace"].title]
    assert sum(FAULTS[f] in text for f in FAULTS) == len(FAULTS)


def test_a_fault_a_contender_cannot_run_says_what_it_lacks() -> None:
    text = render({"outcomes": [], "load": []})
    trainjob = CONTESTANTS["trainjob"]
    row = next(line for line in text.splitlines()
               if line.startswith(f"| {FAULTS['elastic']} | {trainjob.title} |"))  # fmt: skip
    assert "elastic" not in trainjob.faults
    assert trainjob.lacks in row
