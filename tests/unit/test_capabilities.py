"""The trainer's hardware decisions as tables of capabilities -> decision, without the hardware:
which device, which of its devices a rank takes, which precision, whether Gaudi runs lazily."""

from __future__ import annotations

import pytest

from ddp_trainer import capabilities, contract
from ddp_trainer.errors import ConfigError, TrainerError


@pytest.mark.parametrize(
    ("choice", "habana", "cuda", "device"),
    [
        ("auto", True, True, "hpu"),  # a Gaudi image: habana_frameworks wins
        ("auto", False, True, "cuda"),
        ("auto", False, False, "cpu"),
        ("cpu", True, True, "cpu"),
        ("cuda", False, True, "cuda"),
        ("hpu", True, False, "hpu"),
    ],
)
def test_device_type(choice: str, habana: bool, cuda: bool, device: str) -> None:
    assert capabilities.device_type(choice, habana, cuda) == device


@pytest.mark.parametrize(("choice", "named"), [("cuda", "no CUDA device"), ("hpu", "habana")])
def test_a_named_device_that_is_not_there_is_an_error(choice: str, named: str) -> None:
    with pytest.raises(TrainerError, match=named):
        capabilities.device_type(choice, habana=False, cuda=False)


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "visible", "one_per_process", "index"),
    [
        (0, 1, 1, False, 0),  # one process per pod
        (3, 8, 8, False, 3),  # torchrun, one process per GPU
        (1, 2, 8, False, 1),  # fewer processes than GPUs: each its own
        (2, 4, 1, True, 0),  # srun --gpus-per-task=1: each task sees its own device 0
    ],
)
def test_each_rank_takes_a_device_of_its_own(
    local_rank: int, local_world_size: int, visible: int, one_per_process: bool, index: int
) -> None:
    assert capabilities.cuda_index(local_rank, local_world_size, visible, one_per_process) == index


def test_more_processes_than_devices_is_a_configuration_error_naming_both() -> None:
    """`local_rank % device_count()` would put ranks 0 and 2 on one GPU."""
    with pytest.raises(ConfigError) as raised:
        capabilities.cuda_index(2, 4, 2, one_per_process=False)
    message = str(raised.value)
    assert "4 processes on this node (nprocPerNode)" in message
    assert "2 CUDA device(s)" in message
    assert "set nprocPerNode to 2" in message
    assert raised.value.exit_code == contract.EXIT_CONFIG == 78


def test_one_gpu_per_task_only_from_slurm_s_binding() -> None:
    assert capabilities.gpu_per_process({"SLURM_GPUS_PER_TASK": "1"})
    assert not capabilities.gpu_per_process({"SLURM_GPUS_PER_TASK": "2"})
    assert not capabilities.gpu_per_process({})


@pytest.mark.parametrize(
    ("choice", "device", "cuda_bf16", "chosen"),
    [
        ("auto", "cuda", True, "bf16"),  # A100, H100: compute capability 8 and newer
        ("auto", "cuda", False, "fp16"),  # V100, T4: bf16 only emulated, so fp16 + loss scaling
        ("auto", "hpu", False, "bf16"),
        ("auto", "cpu", False, "fp32"),
        ("fp16", "cpu", False, "fp16"),  # asked for: taken as asked
        ("fp32", "cuda", True, "fp32"),
    ],
)
def test_precision(choice: str, device: str, cuda_bf16: bool, chosen: str) -> None:
    assert capabilities.precision(choice, device, cuda_bf16) == chosen


@pytest.mark.parametrize(
    ("reported", "variable", "lazy"),
    [
        (True, None, True),  # a release whose default is lazy (up to 1.20)
        (False, None, False),  # 1.21 and later: eager unless asked
        (True, "0", True),  # what habana_frameworks says wins: it chose its library by it
        (None, None, True),  # a release without is_lazy(): lazy by its default
        (None, "0", False),
        (None, "1", True),
    ],
)
def test_gaudi_lazy_mode(reported: bool | None, variable: str | None, lazy: bool) -> None:
    assert capabilities.gaudi_lazy(reported, variable) is lazy
