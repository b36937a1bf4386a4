"""The trainer's options: one model for the command line, the job file and the CRD.

Every field is a `--kebab-case` flag of `python -m ddp_trainer` and a camelCase key of a
DDPTrainingJob's `spec.trainer`. The operator imports this module to generate the CRD schema
and to turn `spec.trainer` into flags (`to_argv`); `parse_argv` is the inverse, so a key the CRD
accepts but the trainer rejects cannot exist. This module must not import torch.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Sequence
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from ddp_trainer.contract import MAX_EPOCHS, MAX_INT, MAX_PATH, MAX_SECONDS

Dataset = Literal["mnist", "fashion-mnist", "cifar10", "synthetic", "digits"]
Device = Literal["auto", "cuda", "hpu", "cpu"]
Loader = Literal["auto", "device", "dataloader"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Optimizer = Literal["sgd", "adamw"]
LrSchedule = Literal["cosine", "constant"]
GradCompression = Literal["none", "fp16", "bf16"]
WrnDepth = Literal[10, 16, 22, 28, 34, 40]

# A failure at a random moment redoes half of this on average; the save itself runs beside
# training (docs/BENCHMARKS.md measures what it costs).
DEFAULT_CHECKPOINT_SECONDS = 300.0
# Bounds of the options without one of their own: far past any real run, so that every number
# the CRD takes stays a number the trainer can compute with.
MAX_COUNT = 2**31 - 1
MAX_WIDTH = 1024  # a widening factor, or processes of a DataLoader
MAX_CLASSES = 1_000_000
MAX_BATCH = 2**24
MAX_RATE = 1000.0  # a learning rate or a weight decay
MAX_BUCKET_MB = 65536.0
# The crop generator is seeded with (seed * 1_000_003 + step) * 4099 + rank, and torch takes
# at most a uint64: a 32-bit seed leaves every step count of a real run room.
MAX_SEED = 2**32 - 1


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
        "./data",
        max_length=MAX_PATH,
        description="Directory holding (or receiving, with download) the dataset files; "
        "the files may also sit in a subdirectory named after the dataset.",
    )
    download: bool = Field(
        False,
        description="Fetch and checksum-verify the dataset files into dataDir "
        "(one process per node downloads, the others wait).",
    )
    synthetic_samples: int = Field(
        4096,
        ge=64,
        le=MAX_COUNT,
        description="Samples of the synthetic dataset, split into training and validation "
        "by valFraction.",
    )
    synthetic_shape: str = Field(
        "1x28x28",
        max_length=64,
        pattern=r"^[1-9][0-9]*(x[1-9][0-9]*){0,2}$",
        description="Sample shape of the synthetic dataset, CxHxW (e.g. 3x32x32) or a flat size.",
    )
    num_classes: int = Field(
        10, ge=2, le=MAX_CLASSES, description="Classes of the synthetic dataset."
    )
    val_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Share of samples held out for validation where a dataset has no test split "
        "(synthetic, digits).",
    )
    loader: Loader = Field(
        "auto",
        description="Input pipeline: device (the whole dataset stays on the device and is "
        "batched by index), dataloader (a torch DataLoader with worker processes), or auto "
        "(device when the training set fits in 2 GiB as float32).",
    )
    num_workers: int = Field(
        2, ge=0, le=MAX_WIDTH, description="DataLoader worker processes (loader: dataloader)."
    )
    augment: bool = Field(
        False,
        description="Random 2-pixel translations of each training image, plus horizontal "
        "flips for cifar10, done in batches on the device.",
    )

    # --- model
    model: str = Field(
        "mlp",
        max_length=256,
        pattern=r"^(mlp|wide-resnet|resnet18|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$",
        description="Model: mlp, wide-resnet, resnet18 (CIFAR variant), or module:callable for "
        "your own (called with in_shape and num_classes, returns an nn.Module).",
    )
    wrn_depth: WrnDepth = Field(
        16, description="Wide-ResNet depth, 6n+4 for n blocks per group: 10, 16, 22, 28, 34, 40."
    )
    wrn_width: int = Field(4, ge=1, le=MAX_WIDTH, description="Wide-ResNet widening factor.")

    # --- optimisation
    epochs: int = Field(10, ge=1, le=MAX_EPOCHS, description="Epochs to train.")
    batch_size: int = Field(128, ge=1, le=MAX_BATCH, description="Batch size per process.")
    lr: float = Field(0.1, gt=0, le=MAX_RATE, description="Learning rate for a world size of 1.")
    scale_lr: bool = Field(
        True, description="Scale the learning rate linearly with the world size."
    )
    warmup_epochs: float = Field(
        1.0, ge=0, le=MAX_EPOCHS, description="Epochs of linear learning-rate warm-up."
    )
    lr_schedule: LrSchedule = Field(
        "cosine",
        description="Learning rate after the warm-up: cosine (decays to 0 at the last epoch) "
        "or constant.",
    )
    optimizer: Optimizer = Field("sgd", description="Optimizer: sgd (with momentum) or adamw.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum.")
    weight_decay: float = Field(5e-4, ge=0, le=MAX_RATE, description="Weight decay.")
    device: Device = Field(
        "auto",
        description="Device: auto (hpu when Intel Gaudi's habana_frameworks is installed, else "
        "cuda when a GPU is visible, else cpu), cuda, hpu or cpu. One process per device, "
        "chosen by local rank.",
    )
    precision: Precision = Field(
        "auto",
        description="Numeric precision: auto (bf16 on accelerators that support it, fp32 "
        "on CPU), fp32, bf16 or fp16 (with gradient scaling).",
    )
    compile: bool = Field(False, description="Compile the model with torch.compile.")
    bucket_cap_mb: float = Field(
        25.0, gt=0, le=MAX_BUCKET_MB, description="DDP gradient bucket size in MiB."
    )
    grad_compression: GradCompression = Field(
        "none",
        description="Compress gradients to fp16 or bf16 for the all-reduce "
        "(Horovod's fp16 compression).",
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Random seed (same on every rank).")

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
        le=MAX_EPOCHS,
        description="Consecutive epochs at or above targetAccuracy before stopping early.",
    )

    # --- checkpoints, output, cluster
    checkpoint_dir: str | None = Field(
        None,
        max_length=MAX_PATH,
        description="Directory for checkpoints (written by rank 0); training resumes from the "
        "newest valid one.",
    )
    checkpoint_every: int = Field(
        1, ge=1, le=MAX_EPOCHS, description="Save a checkpoint every N epochs."
    )
    checkpoint_every_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_INT,
        description="Also save a checkpoint every N training steps (global steps, counted "
        "across epochs); resuming from one continues mid-epoch with the same batches.",
    )
    checkpoint_every_seconds: float = Field(
        DEFAULT_CHECKPOINT_SECONDS,
        ge=0,
        le=MAX_SECONDS,
        description="Also save a checkpoint once this many seconds have passed since the last "
        "one, at the next step the ranks agree on; 0: never.",
    )
    stop_check_steps: int = Field(
        1,
        ge=1,
        le=MAX_INT,
        description="Every N steps the ranks agree whether one got SIGTERM (a suspend, an "
        "eviction, a drain) or a timed checkpoint is due: one all-reduce of two numbers on a "
        "CPU group. On SIGTERM rank 0 saves at the agreed step and every rank exits 86.",
    )
    keep_checkpoints: int = Field(
        3, ge=1, le=MAX_COUNT, description="Checkpoints kept; older ones are removed."
    )
    summary_file: str | None = Field(
        None,
        max_length=MAX_PATH,
        description="Write the final metrics as JSON to this file (rank 0).",
    )
    timeout_seconds: int = Field(
        300,
        ge=10,
        le=MAX_SECONDS,
        description="Process-group timeout: how long a rank waits for the others at startup and "
        "in a collective before failing (instead of hanging when a rank is lost).",
    )
    log_dir: str | None = Field(
        None,
        max_length=MAX_PATH,
        description="Write TensorBoard event files (rank 0) to this directory or "
        "s3://BUCKET/PREFIX (with the checkpoints' credentials): `tensorboard --logdir` shows "
        "the run, a resumed one continuing the same curves. MLflow gets the same curves when "
        "the environment sets MLFLOW_TRACKING_URI.",
    )
    log_every_steps: int = Field(
        50,
        ge=1,
        le=MAX_INT,
        description="Log the training loss, learning rate, images/s and step time every N "
        "global steps (to logDir and MLflow); epochs are logged at their end.",
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
    """The flags that reproduce `options`: those set explicitly (defaults stay implicit)."""
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


class _Parser(argparse.ArgumentParser):
    """Exits 2 with the usage and one clear line for every bad option, never a traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")


def build_parser(prog: str = "ddp-train") -> argparse.ArgumentParser:
    """An argparse parser with one flag per TrainerOptions field (bools as --x / --no-x)."""
    parser = _Parser(
        prog=prog,
        usage="%(prog)s [--option value | --flag | --no-flag] ...",
        description="Train an image classifier with PyTorch DDP under torchrun, mpirun, "
        "Slurm or as one process. Exit codes: 0 done (or target reached), 1 failed, "
        "2 invalid options.",
        allow_abbrev=False,  # a prefix of a flag is not that flag: the CRD has no prefixes
        argument_default=argparse.SUPPRESS,  # unset flags stay unset: model_fields_set is exact
    )
    for name, field in TrainerOptions.model_fields.items():
        help_text = f"{field.description} (default: {field.default})"
        if field.annotation is bool:
            parser.add_argument(flag(name), action=argparse.BooleanOptionalAction, help=help_text)
            continue
        if typing.get_origin(field.annotation) is Literal:
            choices = typing.get_args(field.annotation)
            # type: argparse turns "16" into 16 before matching an integer choice
            parser.add_argument(flag(name), choices=choices, type=type(choices[0]), help=help_text)
        else:
            parser.add_argument(flag(name), help=help_text)
    return parser


def parse_argv(argv: Sequence[str] | None = None, prog: str = "ddp-train") -> TrainerOptions:
    """Parse command-line flags into validated options; exits 2 naming the first bad flags."""
    parser = build_parser(prog)
    values = vars(parser.parse_args(argv))
    try:
        return TrainerOptions.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = str(error["loc"][0]) if error["loc"] else "options"
            given = values.get(name)
            problems.append(f"{flag(name)} {given!r}: {error['msg']}")
        parser.error("; ".join(problems))
