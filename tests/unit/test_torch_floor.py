"""ddp_trainer.torch_floor: a torch older than the trainer runs on is said before training."""

from __future__ import annotations

import pytest

from ddp_trainer import torch_floor


@pytest.mark.parametrize("version", ["2.9.0", "2.9.1+cu128", "2.15.0", "3.0.0a0", "main"])
def test_the_floor_and_newer_and_unnamed_builds_run(version: str) -> None:
    assert torch_floor.too_old(version) is None


@pytest.mark.parametrize("version", ["2.8.0", "2.7.1a0+git1234", "1.13.1"])
def test_an_older_torch_is_told_what_to_change(version: str) -> None:
    said = torch_floor.too_old(version)
    assert said == (
        f"torch {version} is older than 2.9, the oldest the trainer runs on: build the image "
        "on a base with torch >= 2.9 (trainer_image/Dockerfile's BASE_IMAGE)"
    )
