"""Environment problems end in one line naming the path and the fix, with the exit code the
operator's failure rules read (ddp_trainer.errors): never a traceback.

Real failures, not raised by hand: a directory the process may not write (root without
CAP_DAC_OVERRIDE, as a non-root image user meets it), a full tmpfs in a private mount
namespace, and a download with no network (a private network namespace).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ddp_trainer import contract
from tests.trainer import support

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"),
    reason="needs root, setpriv and unshare (util-linux) to make real permission, disk and "
    "network failures",
)

WITHOUT_DAC_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
QUICK = ("--epochs", "1", "--synthetic-samples", "256", "--batch-size", "64")


def _one_clear_line(run: support.Run, code: int, *phrases: str) -> str:
    assert run.returncode == code, f"exit {run.returncode}\n{run.stderr}"
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("ddp-train: error:")]
    assert len(errors) == 1, run.stderr
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    return errors[0]


def test_a_data_dir_the_user_cannot_write_names_the_path_and_the_fix(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    command = support.trainer_command(
        "--dataset", "mnist", "--download", "--data-dir", str(locked / "data"), *QUICK
    )
    run = support.run(WITHOUT_DAC_OVERRIDE + command, cwd=tmp_path)
    _one_clear_line(run, contract.EXIT_CONFIG, str(locked / "data"), "permission denied")


def test_a_full_checkpoint_volume_names_the_path_and_the_fix(tmp_path: Path) -> None:
    full = tmp_path / "checkpoints"
    full.mkdir()
    trainer = " ".join(
        support.trainer_command("--checkpoint-dir", str(full), *QUICK, "--model", "mlp")
    )
    script = f"mount -t tmpfs -o size=16k tmpfs {full} && exec {trainer}"
    run = support.run(["unshare", "--mount", "sh", "-c", script], cwd=tmp_path)
    _one_clear_line(run, contract.EXIT_CONFIG, str(full), "no space left")


def test_a_failed_download_is_retryable_and_says_where(tmp_path: Path) -> None:
    command = support.trainer_command(
        "--dataset", "mnist", "--download", "--data-dir", str(tmp_path / "data"), *QUICK
    )
    run = support.run(["unshare", "--net", "--", *command], cwd=tmp_path)
    line = _one_clear_line(run, contract.EXIT_TEMPORARY, "could not download", "retried")
    assert str(tmp_path / "data" / "mnist") in line


def test_missing_dataset_files_are_a_storage_error(tmp_path: Path) -> None:
    command = support.trainer_command("--dataset", "cifar10", "--data-dir", str(tmp_path), *QUICK)
    run = support.run(command, cwd=tmp_path)
    _one_clear_line(run, contract.EXIT_CONFIG, "test_batch not found", "--download")
