"""The built-in models, user models, and the recipe's small decisions."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ddp_trainer.errors import TrainerError
from ddp_trainer.models import build_model
from ddp_trainer.options import TrainerOptions
from ddp_trainer.train import lr_factor


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        ("mlp", (1, 28, 28)),
        ("mlp", (64,)),
        ("wide-resnet", (1, 28, 28)),
        ("wide-resnet", (3, 32, 32)),
        ("resnet18", (3, 32, 32)),
        ("resnet18", (1, 8, 8)),
    ],
)
def test_models_map_a_batch_to_logits(model: str, shape: tuple[int, ...]) -> None:
    net = build_model(TrainerOptions(model=model, wrn_depth=10, wrn_width=1), shape, 7)
    assert net(torch.randn(2, *shape)).shape == (2, 7)


def test_wide_resnet_depth_and_width_set_its_size() -> None:
    def parameters(depth: int, width: int) -> int:
        options = TrainerOptions(model="wide-resnet", wrn_depth=depth, wrn_width=width)  # type: ignore[arg-type]
        return sum(p.numel() for p in build_model(options, (3, 32, 32), 10).parameters())

    assert parameters(16, 4) > 2 * parameters(10, 4)
    assert parameters(16, 8) > 3 * parameters(16, 4)
    assert 2.6e6 < parameters(16, 4) < 2.8e6  # WRN-16-4: 2.7 M in the paper


def test_resnet18_has_the_usual_size() -> None:
    options = TrainerOptions(model="resnet18")
    count = sum(p.numel() for p in build_model(options, (3, 32, 32), 10).parameters())
    assert 11.1e6 < count < 11.2e6


def test_convolutional_models_need_images() -> None:
    with pytest.raises(TrainerError, match="needs image samples"):
        build_model(TrainerOptions(model="resnet18"), (64,), 10)


def test_user_models_come_from_module_and_callable() -> None:
    model = build_model(TrainerOptions(model="torch.nn:Identity"), (3,), 2)
    assert isinstance(model, torch.nn.Identity)
    with pytest.raises(TrainerError, match="cannot load"):
        build_model(TrainerOptions(model="no_such_module:net"), (3,), 2)
    with pytest.raises(TrainerError, match=r"returned dict, not an nn\.Module"):
        build_model(TrainerOptions(model="builtins:dict"), (3,), 2)
    with pytest.raises(TrainerError, match=r"calling abs\(in_shape="):
        build_model(TrainerOptions(model="builtins:abs"), (3,), 2)


def test_learning_rate_warms_up_then_follows_the_schedule() -> None:
    cosine = [lr_factor(step, 100, 10, "cosine") for step in range(100)]
    assert cosine[0] == pytest.approx(0.1)
    assert cosine[9] == pytest.approx(1.0)
    assert cosine[10] == pytest.approx(1.0)
    assert cosine[55] == pytest.approx(0.5)
    assert cosine[99] < 0.001
    assert all(a >= b for a, b in itertools.pairwise(cosine[9:]))
    assert lr_factor(80, 100, 10, "constant") == 1.0
    assert lr_factor(0, 100, 0, "cosine") == 1.0
    assert math.isclose(lr_factor(5, 10, 0, "cosine"), 0.5)
