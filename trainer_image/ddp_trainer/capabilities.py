"""What the trainer decides from what the machine can do: the device, which of it a rank takes,
the precision, and whether Gaudi runs lazily. Each is a table from capabilities to a decision,
free of torch, so it is tested without the hardware; `distributed` reads the capabilities.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp_trainer.errors import ConfigError, TrainerError


def device_type(choice: str, habana: bool, cuda: bool) -> str:
    """`--device`: auto takes Gaudi where Intel's habana_frameworks is installed, else CUDA where
    torch sees a device, else the CPU; a named device must be there."""
    if choice == "auto":
        return "hpu" if habana else "cuda" if cuda else "cpu"
    if choice == "cuda" and not cuda:
        raise TrainerError("--device cuda, but torch sees no CUDA device")
    if choice == "hpu" and not habana:
        raise TrainerError("--device hpu needs Intel Gaudi's habana_frameworks package")
    return choice


def cuda_index(local_rank: int, local_world_size: int, visible: int, one_per_process: bool) -> int:
    """The CUDA device of this rank: one per process, by local rank. `one_per_process`: the
    launcher gave each process a device of its own (Slurm's --gpus-per-task), so each sees
    device 0 only. Fewer devices than processes would put two ranks on one device, which NCCL
    refuses or serialises: a configuration to fix, said with both numbers."""
    if one_per_process and visible >= 1:
        return local_rank % visible
    if local_world_size > visible:
        raise ConfigError(
            f"{local_world_size} processes on this node (nprocPerNode) but {visible} CUDA "
            f"device(s) visible to them: give each process a GPU of its own (set nprocPerNode "
            f"to {visible}, or ask for {local_world_size} nvidia.com/gpu per node)"
        )
    return local_rank


def gpu_per_process(env: Mapping[str, str]) -> bool:
    """Whether the launcher bound one GPU to each process (srun --gpus-per-task=1)."""
    return env.get("SLURM_GPUS_PER_TASK", "").strip() == "1"


def precision(choice: str, device: str, cuda_bf16: bool) -> str:
    """`--precision`: auto is bf16 where the hardware computes it (Gaudi, CUDA compute
    capability 8 and newer, ROCm), fp16 with loss scaling on older CUDA devices (a V100 or T4
    emulates bf16, slowly), fp32 on the CPU. `cuda_bf16`: torch.cuda.is_bf16_supported with
    including_emulation=False."""
    if choice != "auto":
        return choice
    if device == "hpu":
        return "bf16"
    if device == "cuda":
        return "bf16" if cuda_bf16 else "fp16"
    return "fp32"


def gaudi_lazy(reported: bool | None, variable: str | None) -> bool:
    """Whether Gaudi runs in lazy mode, where each step ends at mark_step(). `reported`: what
    the installed habana_frameworks says (`habana_frameworks.torch.utils.internal.is_lazy()`,
    as in release 1.19's source), since PT_HPU_LAZY_MODE's default is the release's: 1 up to
    1.20, 0 from 1.21 (docs.habana.ai, "Runtime Environment Variables"). Without it (a release
    that lacks the function), lazy unless PT_HPU_LAZY_MODE=0, as those releases default."""
    if reported is not None:
        return reported
    return (variable or "1").strip() != "0"
