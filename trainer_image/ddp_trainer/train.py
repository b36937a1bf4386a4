"""The training recipe: construct -> setup -> train -> cleanup (`Recipe`, and `run` which
drives it). Each step hands its one job to a small module: distributed (where this process
sits, its device, the process group), datasets and batches (data), models, checkpoint, report
(status of the DDPTrainingJob), progress (what rank 0 prints).

Host and device meet once per epoch: losses and accuracy are summed on the device and read by
a single all-reduce at the end of the epoch. Every decision (early stop, checkpoint) is taken
from that all-reduced result, so all ranks take it together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer import checkpoint, culprit, distributed, logs, stores, tracking
from ddp_trainer.batches import (
    Batches,
    Normalizer,
    augment,
    eval_shard,
    make_batches,
    train_shard,
)
from ddp_trainer.datasets import Splits, download_dataset, load_dataset
from ddp_trainer.errors import TrainerError, is_peer_lost
from ddp_trainer.fault_injection import BatchLog, crash_once_if_asked, hang_if_asked
from ddp_trainer.models import build_model
from ddp_trainer.options import TrainerOptions
from ddp_trainer.preemption import Preemption
from ddp_trainer.progress import EpochMetrics, ProgressBar, Summary, epoch_line, write_summary
from ddp_trainer.report import (
    Heartbeat,
    StatusReporter,
    checkpoint_fields,
    now_utc,
    training_patch,
)

log = logging.getLogger("ddp_trainer")

EVAL_BATCH_FACTOR = 4  # no activations kept for backward: evaluation batches can be larger
DOWNLOAD_TIMEOUT = timedelta(hours=1)  # the wait for local rank 0's download, not a collective


# CPU 1x1 convolutions return weight gradients whose strides differ from the bucket's only in
# size-1 dimensions: the same memory layout, so DDP's warning about it is noise.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


def run(options: TrainerOptions, preemption: Preemption | None = None) -> Summary:
    """Train as one rank of whatever launched this process; SIGTERM stops it at an agreed
    step (`PreemptedError`) once `preemption` (made here when not given) is in place."""
    recipe = Recipe(options, preemption)
    stopped_cleanly = False
    outcome = "failed"
    try:
        recipe.setup()
        summary = recipe.train()
        stopped_cleanly = True
        outcome = "finished"
        return summary
    except PreemptedError:
        stopped_cleanly = True
        outcome = "stopped"
        raise
    except Exception as exc:
        if is_peer_lost(exc):
            recipe.name_the_culprit()
        raise
    finally:
        recipe.close_tracker(outcome)
        recipe.cleanup(stopped_cleanly)


class PreemptedError(Exception):
    """SIGTERM: every rank stopped after the same step, rank 0 saved it (with a checkpoint
    directory); the process exits contract.EXIT_PREEMPTED."""

    def __init__(self, step: int, saved: bool) -> None:
        self.step = step
        self.saved = saved
        super().__init__(
            f"stopped on SIGTERM after step {step}"
            + (f", checkpoint saved at step {step}" if saved else ", no checkpointDir to save to")
        )


@dataclasses.dataclass
class InEpoch:
    """Where a checkpoint taken within an epoch stands: the steps of `epoch` done, and the
    all-reduced sums of those steps, so the resumed epoch reports what an uninterrupted one
    would."""

    epoch: int
    step: int
    loss_sum: float
    images: float
    seconds: float
    samples: int | None = None  # of the epoch's order, trained by all ranks (None: step's)


@dataclasses.dataclass
class Progress:
    """What a checkpoint restores besides the model, optimizer and scaler states."""

    epoch: int = 0  # epochs completed
    val_accuracy: float = 0.0
    best_val_accuracy: float = 0.0
    epochs_at_target: int = 0  # consecutive, for --patience
    stopped_early: bool = False


def _images(splits: Splits) -> bool:
    return len(splits.sample_shape) == 3  # channels, height, width


class Recipe:
    """One rank's training run, in four steps: construct, `setup`, `train`, `cleanup`.

    - construct: where this process sits (torchrun, Open MPI, PMI, Slurm, a host file or none),
      its logging, its device (one per local rank) and CPU threads; nothing heavy.
    - setup: the process group where there are peers (a restart-safe store under torchrun; a
      world of one has none, nor DDP, and steps the bare model), seeds, cudnn.benchmark and
      TF32 on CUDA, the data (optional download by each node's local rank 0, device-resident
      sharded batches, normalisation), the model (channels_last for convolutions),
      precision (auto: bf16 or fp16 with loss scaling on accelerators, fp32 on CPU), the
      optimizer (linear LR scaling, fused kernels on CUDA), resume from the newest valid
      checkpoint (before DDP, which then broadcasts rank 0's weights), DDP (gradients as bucket
      views, BatchNorm statistics once per epoch, optional fp16/bf16 gradient compression),
      torch.compile on request, and rank 0's status reporter.
    - train: per epoch, train (warm-up then constant or cosine LR, optional augmentation),
      evaluate, one all-reduce of the epoch's sums, early stop after --patience epochs at
      --target-accuracy, checkpoint every --checkpoint-every epochs and at the end, print and
      report progress (rank 0); then the summary (and --summary-file).
    - cleanup: the process group is destroyed, whatever happened before.
    """

    # Set when constructed.
    options: TrainerOptions
    world: distributed.World
    device: torch.device
    backend: str  # "none" for a world of one: no process group
    progress: Progress
    resumed_from: int | None  # the epoch a checkpoint restored
    resumed_from_step: int  # the global step a checkpoint restored; 0 for a fresh start
    global_step: int  # training steps done, counted across epochs
    in_epoch: InEpoch | None  # the position a mid-epoch checkpoint restored, until used
    skipped: tuple[int, int]  # the running epoch's samples and steps trained before this run
    preemption: Preemption
    batch_log: BatchLog | None
    epoch_timings: list[tuple[float, float]]  # (images, seconds) per epoch run
    # Set by setup().
    train_size: int
    val_size: int
    train_batches: Batches
    val_batches: Batches
    flip_images: bool
    augment_images: bool
    model: nn.Module  # the bare model: what checkpoints hold
    step_model: nn.Module  # what the steps call: inside DDP with peers, maybe compiled
    channels_last: bool
    precision: str  # fp32, bf16 or fp16
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]
    scaler: torch.amp.GradScaler | None  # fp16 only
    mark_step: Callable[[], None]  # Gaudi's lazy-mode step boundary; a no-op elsewhere
    steps_per_epoch: int
    reporter: StatusReporter | None
    heartbeat: Heartbeat | None  # rank 0's progress within an epoch
    bar: ProgressBar
    tracker: tracking.Tracker | None = None  # rank 0's curves (--log-dir, MLflow)
    logged_at: tuple[float, int]  # (perf_counter, global step) of the last step logged
    ledger: culprit.Ledger | None = None  # this rank's progress in the group's store
    compute_clock: distributed.ComputeClock  # its own part of a step, for the ledger
    saver: checkpoint.Saver | None = None  # rank 0's, with a checkpoint directory
    reported_save: checkpoint.Saved | None = None
    last_save_at: float  # monotonic
    timed_save_asked: bool = False  # rank 0 asked the others for a timed save, not yet made

    def __init__(self, options: TrainerOptions, preemption: Preemption | None = None) -> None:
        self.options = options
        self.world = world = distributed.discover_world(os.environ)
        distributed.export_world(world, os.environ)
        logs.setup(world.rank)
        self.device = distributed.pick_device(options.device, world, os.environ)
        self.compute_clock = distributed.ComputeClock(self.device)
        distributed.set_cpu_threads(world, os.environ)
        self.backend = (
            distributed.backend_for(self.device, os.environ) if world.has_peers else "none"
        )
        self.progress = Progress()
        self.resumed_from = None
        self.resumed_from_step = self.global_step = 0
        self.skipped = (0, 0)  # the epoch's samples and steps before this process trained it
        self.in_epoch = None
        self.epoch_timings = []
        # Before the process group: a SIGTERM until then exits at once.
        self.preemption = preemption or Preemption(
            options.stop_check_steps, timedelta(seconds=options.timeout_seconds)
        )
        self.batch_log = BatchLog.from_env(os.environ, world.rank)
        log.info(
            "rank=%d world_size=%d local_rank=%d local_world_size=%d node_rank=%d launcher=%s "
            "backend=%s device=%s",
            world.rank,
            world.world_size,
            world.local_rank,
            world.local_world_size,
            world.node_rank,
            world.launcher,
            self.backend,
            self.device,
        )

    # --- setup ----------------------------------------------------------------------------

    def setup(self) -> None:
        options, device = self.options, self.device
        if self.world.has_peers:
            distributed.init_process_group(
                self.world, device, self.backend, options.timeout_seconds, os.environ
            )
        if self.world.distributed:
            # A rank without a step for most of the collective timeout logs its stacks; alone,
            # it has a ledger of its own, so a hung job of one is said as well.
            stall_after = options.timeout_seconds * culprit.STALL_SHARE
            self.ledger = culprit.start_ledger(self.world.rank, os.environ, stall_after)
        torch.manual_seed(options.seed)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
            torch.set_float32_matmul_precision("high")  # TF32 matmuls
        splits = self._setup_data()
        self._setup_model(splits)
        self._setup_optimizer()
        shard = math.ceil(self.train_size / self.world.world_size)
        self.steps_per_epoch = math.ceil(shard / options.batch_size)
        self._resume()  # before DDP wraps the model: DDP then broadcasts rank 0's weights
        self._wrap()
        if options.checkpoint_dir and self.world.is_main:
            store = stores.open_store(options.checkpoint_dir)
            self.saver = checkpoint.Saver(store, options.keep_checkpoints, now_utc)
        self.last_save_at = time.monotonic()
        self.reporter = None
        if self.world.is_main and options.report_progress:
            self.reporter = StatusReporter.from_env(os.environ)
        self.heartbeat = None
        if self.reporter is not None:
            self.heartbeat = Heartbeat(
                self.reporter,
                epochs=options.epochs,
                steps_per_epoch=self.steps_per_epoch,
                world_size=self.world.world_size,
                every=Heartbeat.every_from_env(os.environ),
            )
            if self.ledger is not None:
                self.ledger.watch(
                    self.world.world_size,
                    self.heartbeat.report_stall,
                    self.heartbeat.report_straggler,
                )
        self.bar = ProgressBar(enabled=self.world.is_main)
        if self.world.is_main:
            self.tracker = tracking.open_tracker(
                options.log_dir,
                os.environ,
                first_step=self.resumed_from_step + 1,
                params={
                    **options.model_dump(),
                    "world_size": self.world.world_size,
                    "accelerator": self.device.type,
                    "backend": self.backend,
                },
            )

    def _setup_data(self) -> Splits:
        """The dataset as device-resident, sharded, normalised batches; whether to flip and
        augment its images."""
        options, device = self.options, self.device
        splits = self._prepare_data()
        normalize = Normalizer(splits.train_x, device)
        self.train_size, self.val_size = len(splits.train_y), len(splits.val_y)
        self.train_batches = make_batches(
            splits.train_x, splits.train_y, normalize, device, options.batch_size, options
        )
        self.val_batches = make_batches(
            splits.val_x,
            splits.val_y,
            normalize,
            device,
            options.batch_size * EVAL_BATCH_FACTOR,
            options,
        )
        self.flip_images = options.dataset == "cifar10"
        if options.augment and not _images(splits):
            log.warning("--augment ignored: the samples are not images")
        self.augment_images = options.augment and _images(splits)
        return splits

    def _setup_model(self, splits: Splits) -> None:
        """The bare model on the device, channels_last when it convolves images."""
        device = self.device
        self.model = build_model(self.options, splits.sample_shape, splits.num_classes).to(device)
        # NHWC suits tensor cores and oneDNN's CPU convolutions alike (1.3x for a WRN on CPU);
        # Gaudi picks its own layouts.
        has_convolutions = any(isinstance(m, nn.Conv2d) for m in self.model.modules())
        self.channels_last = _images(splits) and has_convolutions and device.type != "hpu"
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)

    def _setup_optimizer(self) -> None:
        """The precision, the optimizer (its base learning rates kept for the schedule) and, for
        fp16, the loss scaler."""
        self.precision = distributed.resolve_precision(self.options.precision, self.device)
        self.optimizer = build_optimizer(
            self.model, self.options, self.world.world_size, self.device
        )
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        # fp16 needs loss scaling; bf16 has fp32's range and does not.
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None

    def _wrap(self) -> None:
        """What the steps call: the model inside DDP when it has peers, compiled on request."""
        options, device = self.options, self.device
        self.step_model = self.model
        if self.world.has_peers:
            self.step_model = wrap_ddp(self.model, options, device)
        if options.compile:
            backend = "hpu_backend" if device.type == "hpu" else "inductor"
            self.step_model = cast(nn.Module, torch.compile(self.step_model, backend=backend))
        self.mark_step = distributed.lazy_mode_step_marker(device)

    def _prepare_data(self) -> Splits:
        """With --download, local rank 0 of each node fetches while the node's others wait."""
        if self.options.download:
            if self.world.local_rank == 0:
                download_dataset(self.options, log.info)
            if self.world.has_peers:
                # A group of its own: a download may outlast the collectives' short timeout.
                with distributed.cpu_group(DOWNLOAD_TIMEOUT) as waiting:
                    dist.barrier(group=waiting)
        splits = load_dataset(self.options)
        if self.world.is_main:
            log.info(
                "%s: %d training and %d validation samples of shape %s, %d classes",
                self.options.dataset,
                len(splits.train_y),
                len(splits.val_y),
                "x".join(map(str, splits.sample_shape)),
                splits.num_classes,
            )
        return splits

    def _resume(self) -> None:
        """Continue from the newest valid checkpoint; rank 0 reads it, all ranks get it."""
        if not self.options.checkpoint_dir:
            return
        found = None
        if self.world.is_main:
            store = stores.open_store(self.options.checkpoint_dir)
            found = checkpoint.load_latest_checkpoint(store)
        if self.world.has_peers:
            # Sent, not re-read: other nodes need not share the checkpoint volume. From host
            # memory: on the default group the pickled checkpoint would go to each device and
            # back, as uint8, a type HCCL's collectives do not take.
            box = [found]
            timeout = timedelta(seconds=self.options.timeout_seconds)
            with distributed.cpu_group(timeout, self.backend) as group:
                dist.broadcast_object_list(box, src=0, group=group)
            found = box[0]
        if found is None:
            return
        state, path = found
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise TrainerError(
                f"checkpoint {path} does not fit this model and optimizer "
                f"(was it written with other options?): {str(exc).splitlines()[0]}"
            ) from None
        self.progress = Progress(**state["progress"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"])
        self.resumed_from = self.progress.epoch
        # Checkpoints of earlier versions hold no step: they were taken at an epoch's end.
        self.global_step = state.get("step", self.progress.epoch * self.steps_per_epoch)
        self.resumed_from_step = self.global_step
        if state.get("in_epoch"):
            self.in_epoch = InEpoch(**state["in_epoch"])
        self._fit_to_world_size(state.get("world_size", self.world.world_size))
        if self.world.is_main:
            log.info(
                "resuming at step %d (epoch %d, step %d of it) from %s",
                self.global_step,
                self.progress.epoch + 1,
                self.in_epoch.step if self.in_epoch else 0,
                path,
            )

    def _fit_to_world_size(self, saved_world_size: int) -> None:
        """A checkpoint of another world size (an elastic group re-formed): keep the position
        in the epoch by samples trained, the step within it as those samples over this
        world's global batch (the learning rate schedule follows it); the global step counts
        on from the checkpoint's, one a step (it names the checkpoints, newest last)."""
        batch = self.options.batch_size
        if self.in_epoch is not None and self.in_epoch.samples is None:
            self.in_epoch.samples = self.in_epoch.step * batch * saved_world_size
        if saved_world_size == self.world.world_size:
            return
        done = 0
        if self.in_epoch is not None and self.in_epoch.epoch == self.progress.epoch + 1:
            assert self.in_epoch.samples is not None
            done = self.in_epoch.samples // (batch * self.world.world_size)
            self.in_epoch.step = done
        if self.world.is_main:
            log.info(
                "the checkpoint is of %d rank(s), this group has %d: the epoch goes on after "
                "its first %d samples",
                saved_world_size,
                self.world.world_size,
                self.in_epoch.samples if self.in_epoch else 0,
            )

    # --- the loop -------------------------------------------------------------------------

    def train(self) -> Summary:
        """The epochs, then the summary."""
        options = self.options
        while self.progress.epoch < options.epochs and not self.progress.stopped_early:
            epoch = self.progress.epoch + 1
            metrics = self.run_epoch(epoch)
            self.update_progress(metrics)
            if options.checkpoint_dir and (
                epoch % options.checkpoint_every == 0 or self.finished()
            ):
                self.save_checkpoint(None, wait=self.finished())
            if self.world.is_main:
                self.bar.clear()
                print(epoch_line(metrics), flush=True)
                self.report(metrics)
                self.log_epoch(metrics)
            crash_once_if_asked(
                epoch, self.world.rank, self.world.world_size, os.environ, self.wait_for_save
            )
            hang_if_asked(epoch, self.world.rank, self.world.world_size, os.environ)
        return self.finish()

    def run_epoch(self, epoch: int) -> EpochMetrics:
        started = time.perf_counter()
        carried, self.in_epoch = self.in_epoch, None
        if carried is not None and carried.epoch != epoch:
            carried = None
        self.skipped = (carried.samples or 0, carried.step) if carried else (0, 0)
        shard = train_shard(  # the same shuffle, minus the samples trained
            self.train_size,
            self.world.rank,
            self.world.world_size,
            epoch,
            self.options.seed,
            skip=self.skipped[0],
        )
        train_loss_sum, images = self.train_epoch(epoch, self.train_batches(shard), carried)
        distributed.synchronize(self.device)
        train_seconds = time.perf_counter() - started + (carried.seconds if carried else 0.0)

        self.sync_buffers()
        val_correct, val_count, val_loss_sum = self.evaluate(
            self.val_batches(eval_shard(self.val_size, self.world.rank, self.world.world_size))
        )
        # The epoch's one host sync: every rank reads the same sums.
        sums = torch.stack(
            [
                train_loss_sum,
                torch.tensor(float(images), device=self.device),
                val_correct,
                val_count,
                val_loss_sum,
            ]
        )
        loss_sum, images_all, correct, count, val_loss = self.all_reduce_sum(sums)
        self.epoch_timings.append((images_all, train_seconds))
        return EpochMetrics(
            epoch=epoch,
            loss=loss_sum / images_all,
            val_loss=val_loss / count,
            val_accuracy=correct / count,
            images_per_sec=images_all / train_seconds,
            epoch_time=time.perf_counter() - started,
        )

    def train_epoch(
        self,
        epoch: int,
        batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
        carried: InEpoch | None = None,
    ) -> tuple[torch.Tensor, int]:
        """One pass over this rank's shard (what is left of it after a mid-epoch resume);
        returns the summed loss (on device) and images, rank 0's with the `carried` sums of
        the steps before the resume."""
        self.step_model.train()
        loss_sum = torch.zeros((), device=self.device)
        seen = 0
        done = 0
        if carried is not None:
            done = carried.step
            if self.world.is_main:  # the sums of all ranks, counted once
                loss_sum += carried.loss_sum
                seen = round(carried.images)
        first_step = (epoch - 1) * self.steps_per_epoch
        started = time.perf_counter()
        self.logged_at = (started, self.global_step)  # step times leave the evaluation out
        for step, (images, labels) in enumerate(batches, start=done):
            if self.ledger is not None:
                self.ledger.started = self.global_step + 1
                self.compute_clock.start()
            self.set_lr(first_step + step)
            x = self.device_layout(images)
            augment_generator = self._augment_generator(first_step + step)
            if augment_generator is not None:
                x = augment(x, self.flip_images, augment_generator)
            with self.autocast():
                loss = nn.functional.cross_entropy(self.step_model(x), labels)
            if self.ledger is not None:  # the rank's own part of the step: no collective in it
                self.ledger.timed(self.compute_clock.lap())
            self.optimizer.zero_grad(set_to_none=True)
            scaled = loss if self.scaler is None else self.scaler.scale(loss)
            torch.autograd.backward(scaled)
            self.mark_step()
            if self.scaler is None:
                self.optimizer.step()
            else:
                self.scaler.step(self.optimizer)  # skipped when fp16 gradients overflowed
                self.scaler.update()
            self.mark_step()
            loss_sum.add_(loss.detach(), alpha=len(labels))  # on the device: no sync, one op
            seen += len(labels)
            self.global_step += 1  # not the position: it goes on across world sizes
            if self.batch_log is not None:
                self.batch_log.step(self.global_step, images, labels, loss)
            if self.tracker is not None and self.global_step % self.options.log_every_steps == 0:
                self.log_steps(loss)
            self.bar.update(epoch, self.options.epochs, step + 1, self.steps_per_epoch, started)
            if self.heartbeat is not None:
                self.heartbeat.beat(epoch - 1, step + 1)
            if self.ledger is not None:
                self.ledger.step = self.global_step
            elapsed = time.perf_counter() - started
            self.after_step(
                epoch, step + 1, loss_sum, seen, elapsed + (carried.seconds if carried else 0.0)
            )
        return loss_sum, seen

    def after_step(
        self, epoch: int, step: int, loss_sum: torch.Tensor, seen: int, seconds: float
    ) -> None:
        """A checkpoint by steps or time, or the stop SIGTERM asked for, at a step every rank
        agrees on; `step` steps of `epoch` are done."""
        options = self.options
        timed_due = (
            self.saver is not None
            and not self.timed_save_asked
            and options.checkpoint_every_seconds > 0
            and time.monotonic() - self.last_save_at >= options.checkpoint_every_seconds
        )
        self.timed_save_asked |= timed_due
        stop, timed = self.preemption.agree(timed_due)
        by_steps = (
            options.checkpoint_every_steps is not None
            and self.global_step % options.checkpoint_every_steps == 0
        )
        if options.checkpoint_dir and (stop or timed or by_steps):
            loss_all, images_all = self.all_reduce_sum(
                torch.stack([loss_sum.float(), torch.tensor(float(seen), device=self.device)])
            )
            skipped, at_step = self.skipped
            samples = skipped + (step - at_step) * options.batch_size * self.world.world_size
            self.save_checkpoint(
                InEpoch(epoch, step, loss_all, images_all, seconds, samples), wait=stop
            )
        if self.saver is not None and self.saver.last is not self.reported_save:
            self.report_checkpoint()
        rank, world_size = self.world.rank, self.world.world_size
        crash_once_if_asked(
            epoch, rank, world_size, os.environ, self.wait_for_save, step=self.global_step
        )
        if stop:
            if self.world.has_peers:
                dist.barrier()  # no rank leaves before rank 0 has saved
            raise PreemptedError(self.global_step, saved=bool(options.checkpoint_dir))

    @torch.no_grad()
    def evaluate(
        self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's (correct, count, loss sum) over its validation shard, on the device."""
        self.step_model.eval()
        correct = torch.zeros((), device=self.device)
        count = torch.zeros((), device=self.device)
        loss_sum = torch.zeros((), device=self.device)
        for images, labels in batches:
            with self.autocast():
                logits = self.step_model(self.device_layout(images))
            loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
            correct += (logits.argmax(dim=1) == labels).sum()
            count += len(labels)
            self.mark_step()
        return correct, count, loss_sum

    def update_progress(self, metrics: EpochMetrics) -> None:
        """Early stop after --patience epochs at the target, from the all-reduced accuracy."""
        progress, target = self.progress, self.options.target_accuracy
        progress.epoch = metrics.epoch
        progress.val_accuracy = metrics.val_accuracy
        progress.best_val_accuracy = max(progress.best_val_accuracy, metrics.val_accuracy)
        reached = target is not None and metrics.val_accuracy >= target
        progress.epochs_at_target = progress.epochs_at_target + 1 if reached else 0
        progress.stopped_early = (
            progress.epochs_at_target >= self.options.patience
            and metrics.epoch < self.options.epochs
        )
        if progress.stopped_early and self.world.is_main:
            log.info(
                "validation accuracy %.4f >= target %s for %d epoch(s): stopping",
                metrics.val_accuracy,
                target,
                progress.epochs_at_target,
            )

    def finished(self) -> bool:
        return self.progress.stopped_early or self.progress.epoch >= self.options.epochs

    def save_checkpoint(self, in_epoch: InEpoch | None, wait: bool) -> None:
        """Rank 0 snapshots the state and writes it in the background (`wait`: before
        returning); the other ranks hold the same state and go on."""
        self.last_save_at = time.monotonic()
        self.timed_save_asked = False
        if self.saver is not None:
            rng: dict[str, Any] = {"torch": torch.get_rng_state()}
            if self.device.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state()
            state = {
                "epoch": self.progress.epoch,
                "step": self.global_step,
                "in_epoch": dataclasses.asdict(in_epoch) if in_epoch else None,
                "model": self.model.state_dict(),  # the bare model: no DDP or compile prefixes
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "progress": dataclasses.asdict(self.progress),
                "rng": rng,
                "world_size": self.world.world_size,
                "options": self.options.model_dump(),
            }
            self.saver.save(state, self.global_step, self.progress.epoch, wait=wait)
            if wait:
                self.report_checkpoint()

    def wait_for_save(self) -> None:
        """Until rank 0's write in flight is done; its error, if it had one, is raised."""
        if self.saver is not None:
            self.saver.wait()

    def report_checkpoint(self) -> None:
        """status.training.checkpoint: the newest completed save."""
        assert self.saver is not None
        saved = self.reported_save = self.saver.last
        if saved is not None:
            log.info(
                "checkpoint at step %d saved in %.3f s (training paused %.3f s for the snapshot)",
                saved.step,
                saved.seconds,
                saved.paused,
            )
        if saved is not None and self.reporter is not None:
            fields = checkpoint_fields(
                step=saved.step,
                epoch=saved.epoch,
                saved_at=saved.saved_at,
                seconds=saved.seconds,
                resumed_from_step=self.resumed_from_step,
            )
            self.reporter.report({"status": {"training": fields}})

    def report(self, metrics: EpochMetrics) -> None:
        if self.reporter is None:
            return
        patch = training_patch(
            epoch=metrics.epoch,
            epochs=self.options.epochs,
            loss=metrics.loss,
            val_loss=metrics.val_loss,
            val_accuracy=metrics.val_accuracy,
            best_val_accuracy=self.progress.best_val_accuracy,
            images_per_sec=metrics.images_per_sec,
            now=now_utc(),
        )
        if self.heartbeat is not None:
            patch["status"]["training"].update(self.heartbeat.epoch_report(metrics.epoch))
        self.reporter.report(patch, final=self.finished())

    def log_steps(self, loss: torch.Tensor) -> None:
        """Rank 0's loss (read now: a device sync every --log-every-steps), the learning rate,
        and images/s and seconds per step since the last steps logged."""
        assert self.tracker is not None
        loss_value = float(loss)
        now, step = time.perf_counter(), self.global_step
        since, steps = now - self.logged_at[0], step - self.logged_at[1]
        self.logged_at = (now, step)
        images = steps * self.options.batch_size * self.world.world_size
        self.tracker.log(
            step,
            {
                "train/loss": loss_value,
                "train/lr": self.optimizer.param_groups[0]["lr"],
                "train/images_per_sec": images / since if since > 0 else 0.0,
                "train/step_seconds": since / steps if steps else 0.0,
            },
        )

    def log_epoch(self, metrics: EpochMetrics) -> None:
        """The epoch's all-reduced figures at the global step it ended on."""
        if self.tracker is None:
            return
        self.tracker.log(
            self.global_step,
            {
                "epoch/loss": metrics.loss,
                "epoch/val_loss": metrics.val_loss,
                "epoch/val_accuracy": metrics.val_accuracy,
                "epoch/images_per_sec": metrics.images_per_sec,
                "epoch/seconds": metrics.epoch_time,
                "epoch": metrics.epoch,
            },
        )
        self.tracker.flush()

    def close_tracker(self, outcome: str) -> None:
        """The curves' last events, and the newest checkpoint's location for MLflow."""
        if self.tracker is None:
            return
        saved = None
        if self.saver is not None:
            with contextlib.suppress(Exception):  # its error is training's to raise
                saved = self.saver.wait()
        where = None
        if saved is not None and self.saver is not None:
            where = self.saver.store.location(checkpoint.checkpoint_name(saved.step))
        self.tracker.close(outcome, where)

    def finish(self) -> Summary:
        self.wait_for_save()
        timings = self.epoch_timings[1:] or self.epoch_timings  # the first epoch warms up
        images = sum(images for images, _ in timings)
        seconds = sum(seconds for _, seconds in timings)
        summary = Summary(
            world_size=self.world.world_size,
            epochs_run=self.progress.epoch,
            val_accuracy=self.progress.val_accuracy,
            best_val_accuracy=self.progress.best_val_accuracy,
            images_per_sec=images / seconds if seconds else 0.0,
            stopped_early=self.progress.stopped_early,
            resumed_from_epoch=self.resumed_from,
            first_epoch_seconds=self.epoch_timings[0][1] if self.epoch_timings else 0.0,
            peak_device_memory_mib=(
                torch.cuda.max_memory_allocated(self.device) / 2**20
                if self.device.type == "cuda"
                else None
            ),
        )
        if self.world.is_main:
            if self.options.summary_file:
                write_summary(Path(self.options.summary_file), summary)
            log.info(
                "done: %d epochs, validation accuracy %.4f (best %.4f), %.0f images/s",
                summary.epochs_run,
                summary.val_accuracy,
                summary.best_val_accuracy,
                summary.images_per_sec,
            )
        return summary

    def name_the_culprit(self) -> None:
        """A collective timed out or a peer went away: say which rank stopped first."""
        if self.ledger is not None:
            log.error("%s", culprit.name_the_culprit(self.ledger, self.world.world_size))

    def cleanup(self, stopped_cleanly: bool = True) -> None:
        if self.saver is not None:
            with contextlib.suppress(Exception):  # the error that ended training comes first
                self.saver.wait()  # a checkpoint begun is finished before the process ends
        if self.ledger is not None:
            self.ledger.stop()
        if dist.is_initialized() and stopped_cleanly:  # else its peers may never answer
            self.preemption.close()
            dist.destroy_process_group()

    # --- small helpers ----------------------------------------------------------------------

    def set_lr(self, step: int) -> None:
        factor = lr_factor(
            step,
            total_steps=self.options.epochs * self.steps_per_epoch,
            warmup_steps=round(self.options.warmup_epochs * self.steps_per_epoch),
            schedule=self.options.lr_schedule,
        )
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * factor

    def device_layout(self, images: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            return images.contiguous(memory_format=torch.channels_last)
        return images

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _augment_generator(self, step: int) -> torch.Generator | None:
        """Different crops on each rank and step, seeded by both: the same after a resume
        anywhere in an epoch, with no generator state to save."""
        if not self.augment_images:
            return None
        generator_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        generator = torch.Generator(device=generator_device)
        seed = (self.options.seed * 1_000_003 + step) * 4099 + self.world.rank
        return generator.manual_seed(seed)

    def sync_buffers(self) -> None:
        """BatchNorm statistics from rank 0 once an epoch (DDP is told not to, every step)."""
        if not self.world.has_peers:
            return
        for buffer in self.model.buffers():
            if buffer.is_floating_point():  # HCCL has no int64; the step counters do not matter
                dist.broadcast(buffer, src=0)

    def all_reduce_sum(self, values: torch.Tensor) -> list[float]:
        """SUM, in float32: the one reduction gloo, nccl and hccl all have for this dtype."""
        values = values.float()
        if self.world.has_peers:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return [float(value) for value in values.tolist()]


def build_optimizer(
    model: nn.Module, options: TrainerOptions, world_size: int, device: torch.device
) -> torch.optim.Optimizer:
    """Linear LR scaling with the world size (Goyal et al.); fused kernels on CUDA."""
    lr = options.lr * (world_size if options.scale_lr else 1)
    fused = True if device.type == "cuda" else None
    if options.optimizer == "adamw":
        return torch.optim.AdamW(
            model.parameters(), lr=lr, weight_decay=options.weight_decay, fused=fused
        )
    return torch.optim.SGD(
        model.parameters(),
        lr=lr,
        momentum=options.momentum,
        weight_decay=options.weight_decay,
        fused=fused,
    )


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Linear warm-up to 1, then constant or a cosine decay to 0 at the last step."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decayed = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(decayed, 1.0)))


def wrap_ddp(model: nn.Module, options: TrainerOptions, device: torch.device) -> nn.Module:
    # BatchNorm statistics are sent once per epoch (sync_buffers), not before every step; torch
    # renamed the switch, and base images (NGC, Gaudi) ship older torch versions.
    no_buffer_sync: dict[str, Any] = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else {"broadcast_buffers": False}
    )
    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,  # HPU: none, as Intel says
        bucket_cap_mb=options.bucket_cap_mb,
        gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copies
        **no_buffer_sync,
    )
    if options.grad_compression != "none":
        hook = {
            "fp16": default_hooks.fp16_compress_hook,
            "bf16": default_hooks.bf16_compress_hook,
        }[options.grad_compression]
        ddp.register_comm_hook(state=None, hook=hook)
    return ddp
