"""Ranks started warm (ddp_trainer.warm), for real: interpreters that imported torch before
their rank was known, run as `python -u` would have run the rank, or not used at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_trainer import warm
from kube_ddp.local.plan import free_port
from tests.trainer import support

# What a rank saw at its start: whether torch was imported before its first line, its
# arguments, variables, sys.path[0] and __name__; then it ends with argv[2].
REPORT = """\
import json, os, sys
warm = "torch" in sys.modules
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"warm": warm, "argv": sys.argv, "rank": os.environ.get("RANK"),
                          "path0": sys.path[0], "name": __name__,
                          "stdin": os.path.realpath("/proc/self/fd/0"),
                          "process": open("/proc/self/cmdline").read().split("\\0")[:3],
                          "unbuffered": sys.stdout.write_through}) + "\\n")
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def ranks() -> Iterator[warm.WarmRanks]:
    made = warm.WarmRanks(sys.executable)
    yield made
    made.close()


def report_script(tmp_path: Path) -> Path:
    script = tmp_path / "scripts" / "rank.py"
    script.parent.mkdir()
    script.write_text(REPORT)
    return script


def reports(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_waiting_interpreter_runs_the_script_as_python_would(
    tmp_path: Path, ranks: warm.WarmRanks
) -> None:
    script, out = report_script(tmp_path), tmp_path / "out"
    ranks.prepare(1, [sys.executable, "-u", "rank.py"])
    [waiting] = ranks.waiting
    proc = ranks.take(
        [sys.executable, "-u", str(script), str(out), "7"], {**os.environ, "RANK": "3"}
    )
    assert proc is waiting and proc.wait(timeout=60) == 7
    [seen] = reports(out)
    assert seen == {
        "warm": True,
        "argv": [str(script), str(out), "7"],
        "rank": "3",
        "path0": str(script.parent),
        "name": "__main__",
        "stdin": os.devnull,
        "process": [sys.executable, "-u", "-m"],
        "unbuffered": True,
    }


def test_a_waiting_interpreter_runs_a_module_as_python_m_would(
    ranks: warm.WarmRanks, capfd: pytest.CaptureFixture[str]
) -> None:
    ranks.prepare(1, [sys.executable, "-u", "rank.py"])
    proc = ranks.take([sys.executable, "-u", "-m", "ddp_trainer", "--help"], dict(os.environ))
    assert proc is not None and proc.wait(timeout=60) == 0
    assert "usage: ddp-train" in capfd.readouterr().out


def test_a_rank_that_raises_ends_as_python_would(
    tmp_path: Path, ranks: warm.WarmRanks, capfd: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "raises.py"
    script.write_text("raise RuntimeError('the rank failed')\n")
    ranks.prepare(1, [sys.executable, "-u", "rank.py"])
    proc = ranks.take([sys.executable, "-u", str(script)], dict(os.environ))
    assert proc is not None and proc.wait(timeout=60) == 1
    assert "RuntimeError: the rank failed" in capfd.readouterr().err


def test_a_warm_rank_ends_on_its_groups_signal(tmp_path: Path, ranks: warm.WarmRanks) -> None:
    """torchrun stops a rank by signalling its process group (its session of its own)."""
    script = tmp_path / "waits.py"
    script.write_text("import time\ntime.sleep(120)\n")
    ranks.prepare(1, [sys.executable, "-u", "rank.py"])
    proc = ranks.take([sys.executable, "-u", str(script)], dict(os.environ))
    assert proc is not None and os.getpgid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM


@pytest.mark.parametrize(
    "command",
    [
        ["/usr/bin/python3", "-u", "rank.py"],  # another interpreter
        [sys.executable, "rank.py"],  # not unbuffered: not torchrun's form
        ["numactl", "--cpunodebind=0", sys.executable, "-u", "rank.py"],  # a wrapper
    ],
)
def test_a_command_of_another_form_is_started_cold_and_no_interpreter_waits_on(
    ranks: warm.WarmRanks, command: list[str]
) -> None:
    ranks.prepare(2, [sys.executable, "-u", "rank.py"])
    started = list(ranks.waiting)
    assert ranks.take(command, dict(os.environ)) is None
    assert ranks.waiting == [] and all(proc.returncode is not None for proc in started)
    ranks.prepare(2, command)  # known before they start: none is started for nothing
    assert ranks.waiting == []


def test_an_environment_changed_since_the_start_is_started_cold_torchs_settings_aside(
    ranks: warm.WarmRanks, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = [sys.executable, "-u", "-m", "ddp_trainer", "--help"]
    ranks.prepare(1, [sys.executable, "-u", "rank.py"])
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM")  # torch's agent sets it
    proc = ranks.take(command, dict(os.environ))
    assert proc is not None and proc.wait(timeout=60) == 0
    ranks.prepare(1, [sys.executable, "-u", "rank.py"])
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # read as torch loads: the rank must see it
    assert ranks.take(command, dict(os.environ)) is None


def test_an_interpreter_that_died_is_replaced_by_a_cold_start(ranks: warm.WarmRanks) -> None:
    ranks.prepare(1, [sys.executable, "-u", "rank.py"])
    ranks.waiting[0].kill()
    ranks.waiting[0].wait()
    assert ranks.take([sys.executable, "-u", "-m", "ddp_trainer"], dict(os.environ)) is None


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_the_agent_starts_its_ranks_warm_and_restarts_them_warm(
    tmp_path: Path, enabled: str
) -> None:
    """kube-ddp's torchrun, 2 local ranks, a retryable exit (75) once: the first ranks (forked
    from the agent) and the restarted ones (started as the agent restarted them) found torch
    imported at their first line, and wrote unbuffered, as `python -u`; with
    DDP_TRAINER_WARM_RANKS=0 neither found torch, and both were started as torchrun does."""
    script, out = report_script(tmp_path), tmp_path / "out"
    marker = tmp_path / "failed-once"
    script.write_text(
        f"import pathlib, sys\nfirst = not pathlib.Path({str(marker)!r}).exists()\n"
        + REPORT.replace("sys.exit(int(sys.argv[2]))", "")
        + f"pathlib.Path({str(marker)!r}).touch()\nsys.exit(75 if first else 0)\n"
    )
    command = support.agent_command(
        str(script), str(out), "0", port=free_port(), nnodes="1", host=True, nproc=2
    )
    env = support.clean_env(KUBEDDP_RETRYABLE_EXIT_CODES="75", DDP_TRAINER_WARM_RANKS=enabled)
    env.pop("PYTHONUNBUFFERED", None)  # the agent's own streams buffered, as in an image
    support.run(command, env).check()
    first, restarted = reports(out)[:2], reports(out)[2:]
    assert len(restarted) == 2
    for report in first + restarted:
        assert report["warm"] is (enabled == "1") and report["unbuffered"] is True
    assert sorted(str(report["rank"]) for report in first + restarted) == ["0", "0", "1", "1"]
    if enabled == "1":
        assert {tuple(report["process"]) for report in first} == {tuple(command[:3])}
        assert {tuple(report["process"]) for report in restarted} == {(sys.executable, "-u", "-m")}
    else:
        assert {tuple(report["process"]) for report in first + restarted} == {
            (sys.executable, "-u", str(script))
        }


PREPARED = """\
import sys
from ddp_trainer import warm
warm.prepare(sys.argv[1:])
print(sorted(m for m in ("ddp_trainer.train", "sklearn.datasets") if m in sys.modules))
"""


@pytest.mark.parametrize(
    ("argv", "imported"),
    [
        (["-m", "ddp_trainer", "--dataset=digits"], ["ddp_trainer.train", "sklearn.datasets"]),
        (["-m", "ddp_trainer", "--dataset=synthetic"], ["ddp_trainer.train"]),
        (["-m", "ddp_trainer", "--dataset=digits", "--epochs=-1"], ["ddp_trainer.train"]),
        (["-m", "other_trainer", "--dataset=digits"], []),
        (["train.py", "--dataset=digits"], []),
    ],
)
def test_a_waiting_trainer_rank_imports_what_its_options_need(
    argv: list[str], imported: list[str]
) -> None:
    """Nothing said, nothing ended: a bad option (--epochs=-1) is for the rank's main to say."""
    run = support.run([sys.executable, "-c", PREPARED, *argv])
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, str(imported), "")


def test_an_interpreter_that_reads_no_order_is_replaced_by_a_cold_start(
    ranks: warm.WarmRanks,
) -> None:
    """Alive but its stdin closed (it is dying): the order breaks the pipe, no error escapes,
    torchrun starts the rank itself and nothing waits on."""
    closes_stdin = "import os, time; os.close(0); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", closes_stdin], stdin=subprocess.PIPE)
    time.sleep(1)  # until its stdin is closed
    ranks.waiting, ranks.started_in = [proc], dict(os.environ)
    order = {**os.environ, "PADDING": "x" * 100_000}  # more than a pipe holds
    assert ranks.take([sys.executable, "-u", "-m", "ddp_trainer"], order) is None
    assert ranks.waiting == [] and proc.returncode is not None
