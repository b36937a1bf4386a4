"""`make test`'s two lanes (tests/lanes.py), run for real on a small tree of tiers: every test
runs once, in its lane, the lane beside on a control plane of its own, and a failure in either
lane fails the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import lanes

QUIET = ["-q", "-p", "no:cacheprovider"]
ENV = (
    "import os\nENV = (os.environ.get('KUBEDDP_STATE_DIR', ''), "
    "os.environ.get('KUBEDDP_BUILD_NICE', ''))\n"
)


def tree(tmp_path: Path, failing: str = "") -> Path:
    """tests/<tier>/test_<name>.py, each test checking what its lane gives it: the lane beside
    a cluster state directory of its own, the rest builds at the tests' own priority."""
    tests = tmp_path / "tests"
    beside, rest = (str(tmp_path / lanes.BESIDE_STATE_DIR), ""), ("", "0")
    files = {
        "unit/test_unit.py": rest,
        "trainer/test_trainer.py": beside,
        "cluster/test_lifecycle.py": beside,
        "cluster/test_crd.py": rest,
        "e2e/test_jobs.py": rest,
        "test_outside_the_tiers.py": rest,
    }
    for path, env in files.items():
        name = Path(path).stem
        verdict = "False" if name == failing else f"ENV == {env!r}"
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).write_text(f"{ENV}\ndef {name}():\n    assert {verdict}\n")
    return tests


@pytest.fixture(autouse=True)
def no_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `make test` starts: this session may itself run in the lane beside."""
    monkeypatch.delenv("KUBEDDP_STATE_DIR", raising=False)
    monkeypatch.delenv("KUBEDDP_BUILD_NICE", raising=False)


def test_every_test_runs_once_in_its_lane(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert lanes.run(QUIET, tests=tree(tmp_path)) == 0
    out = capfd.readouterr().out
    streamed, beside = out.split("===== lane beside: its session's output =====")
    assert "4 passed" in streamed  # unit, the other cluster module, e2e, the test outside
    assert "2 passed" in beside  # trainer and the cluster module beside
    assert "lane the rest: exit 0" in beside and "lane beside: exit 0" in beside


@pytest.mark.parametrize("failing", ["test_trainer", "test_jobs"])
def test_a_failure_in_either_lane_fails_the_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], failing: str
) -> None:
    assert lanes.run(QUIET, tests=tree(tmp_path, failing)) == 1
    assert "1 failed" in capfd.readouterr().out
