"""The options model as a command line: every field a flag, and to_argv/parse_argv inverse."""

from __future__ import annotations

import subprocess
import sys
import typing
from typing import Any, Literal

import pytest

from ddp_trainer.options import TrainerOptions, build_parser, flag, parse_argv, to_argv


def _non_default(name: str) -> Any:
    """A valid value for each field that differs from its default."""
    field = TrainerOptions.model_fields[name]
    special = {
        "synthetic_shape": "3x32x32",
        "model": "my_models.nets:tiny",
        "val_fraction": 0.25,
        "momentum": 0.8,
        "target_accuracy": 0.75,
        "checkpoint_dir": "/ckpt",
        "log_dir": "s3://curves/run-1",
        "summary_file": "/out/summary.json",
        "lr": 0.025,
        "warmup_epochs": 0.5,
        "bucket_cap_mb": 100.0,
        "weight_decay": 0.0001,
        "checkpoint_every_steps": 500,
    }
    if name in special:
        return special[name]
    if field.annotation is bool:
        return not field.default
    if typing.get_origin(field.annotation) is Literal:
        return next(c for c in typing.get_args(field.annotation) if c != field.default)
    if field.annotation is int:
        return field.default + 3
    return field.default + "-other" if isinstance(field.default, str) else field.default


def test_parse_argv_inverts_to_argv_for_every_option() -> None:
    everything = TrainerOptions(
        **{name: _non_default(name) for name in TrainerOptions.model_fields}
    )
    assert everything.model_fields_set == set(TrainerOptions.model_fields)
    parsed = parse_argv(to_argv(everything))
    assert parsed == everything
    assert parsed.model_fields_set == everything.model_fields_set


def test_defaults_stay_implicit_both_ways() -> None:
    assert to_argv(TrainerOptions()) == []
    assert parse_argv([]) == TrainerOptions()
    partial = parse_argv(["--epochs", "3", "--no-scale-lr", "--wrn-depth", "22"])
    assert partial.model_fields_set == {"epochs", "scale_lr", "wrn_depth"}
    assert partial.wrn_depth == 22
    assert to_argv(partial) == ["--wrn-depth", "22", "--epochs", "3", "--no-scale-lr"]


def test_camel_case_job_keys_and_flags_name_the_same_options() -> None:
    from_job = TrainerOptions.model_validate({"batchSize": 64, "targetAccuracy": 0.9})
    assert to_argv(from_job) == ["--batch-size", "64", "--target-accuracy", "0.9"]


def test_every_option_is_a_described_flag() -> None:
    help_text = build_parser().format_help()
    for name, field in TrainerOptions.model_fields.items():
        assert field.description, f"{name} needs a description (it is kubectl explain's text)"
        assert flag(name) in help_text
        if field.annotation is bool:
            assert f"--no-{flag(name)[2:]}" in help_text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epoch", "3"], "unrecognized arguments: --epoch"),  # no prefix matching
        (["--batch-size", "0"], "--batch-size '0': Input should be greater than or equal to 1"),
        (["--wrn-depth", "12"], "argument --wrn-depth: invalid choice: 12"),
        (["--lr", "fast"], "--lr 'fast'"),
    ],
)
def test_bad_options_exit_2_with_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_argv(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_options_module_imports_no_torch() -> None:
    """The operator image imports it and has no torch."""
    probe = "import sys, ddp_trainer.options; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0
