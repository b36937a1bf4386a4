"""The trainer's options: one model for the command line, the job file and the CRD.

Every field is a `--kebab-case` flag of `python -m ddp_trainer` and a camelCase key of a
DDPTrainingJob's `spec.trainer`. The operator imports this module to generate the CRD schema
and to turn `spec.trainer` into flags (`to_argv`), so a key the CRD accepts but the trainer
rejects cannot exist. This module must not import torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Dataset = Literal["mnist", "fashion-mnist", "cifar10", "synthetic", "digits"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Optimizer = Literal["sgd", "adamw"]
GradCompression = Literal["none", "fp16", "bf16"]


class TrainerOptions(BaseModel):
    """Options of the generic DDP trainer (`python -m ddp_trainer --help`)."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
    )

    # --- data
    dataset: Dataset = Field(
        "synthetic",
        description="Dataset: mnist, fashion-mnist (IDX files), cifar10 (python pickle batches), "
        "synthetic (generated, learnable) or digits (scikit-learn's bundled 8x8 digits).",
    )
    data_dir: str = Field(
        "./data", description="Directory holding (or receiving, with download) the dataset files."
    )
    download: bool = Field(
        False,
        description="Fetch and checksum-verify the dataset files into dataDir "
        "(one process per node downloads, the others wait).",
    )
    synthetic_samples: int = Field(
        4096, ge=64, description="Training samples of the synthetic dataset."
    )
    synthetic_shape: str = Field(
        "1x28x28",
        pattern=r"^[1-9][0-9]*(x[1-9][0-9]*){0,2}$",
        description="Sample shape of the synthetic dataset, CxHxW (e.g. 3x32x32) or a flat size.",
    )
    num_classes: int = Field(10, ge=2, description="Classes of the synthetic dataset.")
    val_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Share of samples held out for validation where a dataset has no test split.",
    )
    num_workers: int = Field(
        2, ge=0, description="DataLoader worker processes, for data that is not kept on device."
    )

    # --- model
    model: str = Field(
        "mlp",
        pattern=r"^(mlp|wide-resnet|resnet18|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$",
        description="Model: mlp, wide-resnet, resnet18, or module:callable for your own "
        "(called with in_shape and num_classes, returns an nn.Module).",
    )
    wrn_depth: int = Field(16, ge=10, description="Wide-ResNet depth (6n+4).")
    wrn_width: int = Field(4, ge=1, description="Wide-ResNet widening factor.")

    # --- optimisation
    epochs: int = Field(10, ge=1, description="Epochs to train.")
    batch_size: int = Field(128, ge=1, description="Batch size per process.")
    lr: float = Field(0.1, gt=0, description="Learning rate for a world size of 1.")
    scale_lr: bool = Field(
        True, description="Scale the learning rate linearly with the world size."
    )
    warmup_epochs: float = Field(
        1.0, ge=0, description="Epochs of linear learning-rate warm-up."
    )
    optimizer: Optimizer = Field("sgd", description="Optimizer: sgd (with momentum) or adamw.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum.")
    weight_decay: float = Field(5e-4, ge=0, description="Weight decay.")
    precision: Precision = Field(
        "auto",
        description="Numeric precision: auto (bf16 on accelerators that support it, fp32 "
        "on CPU), fp32, bf16 or fp16 (with gradient scaling).",
    )
    compile: bool = Field(False, description="Compile the model with torch.compile.")
    bucket_cap_mb: float = Field(25.0, gt=0, description="DDP gradient bucket size in MiB.")
    grad_compression: GradCompression = Field(
        "none",
        description="Compress gradients to fp16 or bf16 for the all-reduce "
        "(Horovod's fp16 compression).",
    )
    seed: int = Field(0, ge=0, description="Random seed (same on every rank).")

    # --- stopping
    target_accuracy: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Stop early once validation accuracy reaches this value (0-1].",
    )
    patience: int = Field(
        1,
        ge=1,
        description="Consecutive epochs at or above targetAccuracy before stopping early.",
    )

    # --- checkpoints and output
    checkpoint_dir: str | None = Field(
        None,
        description="Directory for checkpoints; training resumes from the newest valid one.",
    )
    checkpoint_every: int = Field(1, ge=1, description="Save a checkpoint every N epochs.")
    keep_checkpoints: int = Field(3, ge=1, description="Checkpoints kept; older ones are removed.")
    summary_file: str | None = Field(
        None, description="Write the final metrics as JSON to this file (rank 0)."
    )
    timeout_seconds: int = Field(
        300,
        ge=10,
        description="Process-group timeout: how long a collective waits for a lost rank.",
    )
    report_progress: bool = Field(
        True,
        description="Rank 0 patches status.training of its DDPTrainingJob after each epoch "
        "(when run by the operator).",
    )


def flag(field_name: str) -> str:
    """The command-line flag of an option: `batch_size` -> `--batch-size`."""
    return "--" + field_name.replace("_", "-")


def to_argv(options: TrainerOptions) -> list[str]:
    """The flags that reproduce `options`, for the options set explicitly (defaults stay implicit)."""
    argv: list[str] = []
    for name in TrainerOptions.model_fields:
        if name not in options.model_fields_set:
            continue
        value: Any = getattr(options, name)
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            argv.extend([flag(name), str(value)])
    return argv
