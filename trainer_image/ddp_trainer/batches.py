"""Each rank's batches for an epoch: DistributedSampler's sharding, served from the device.

Training uses DistributedSampler's semantics: one permutation per epoch from (seed, epoch),
the same on every rank, padded by wrapping so all ranks take the same number of steps, and
rank r takes every world_size-th index from r. Evaluation takes `r::world_size` without padding,
so the all-reduced metrics count each sample exactly once.

A dataset that fits stays on the device, normalized once, and a batch is one `index_select`:
no per-sample Python, no collation, no host-to-device copy per step. Larger ones go through a
DataLoader whose workers gather uint8 samples, from one copy of the split in shared memory,
that are normalized after the copy to the device.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from ddp_trainer.options import TrainerOptions

DEVICE_BUDGET_BYTES = 2 << 30  # training sets up to this size as float32 stay on the device
AUGMENT_SHIFT = 2  # pixels of random translation


def train_shard(
    num_samples: int, rank: int, world_size: int, epoch: int, seed: int, skip: int = 0
) -> torch.Tensor:
    """This rank's sample indices for a training epoch (DistributedSampler, drop_last=False),
    less the first `skip` samples of the epoch's order: those the group trained before a
    mid-epoch resume, at this world size or another (the steps so far took the order's first
    steps x batch x world samples). What is left is sharded anew, padded from the order's
    start."""
    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator)
    rest = order[skip:]
    total = math.ceil(len(rest) / world_size) * world_size
    padded = torch.cat([rest, order.repeat(math.ceil(total / num_samples))])[:total]
    return padded[rank:total:world_size]


def eval_shard(num_samples: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's validation indices: every sample on exactly one rank, no padding."""
    return torch.arange(rank, num_samples, world_size)


class Normalizer:
    """Per-channel standardisation with the training set's statistics."""

    def __init__(self, train_x: np.ndarray, device: torch.device) -> None:
        # Channels are axis 1 of an image batch; a flat sample has one "channel".
        axes = (0, *range(2, train_x.ndim)) if train_x.ndim == 4 else None
        sample = train_x[:50_000].astype(np.float64)  # statistics need no more than this
        mean, std = sample.mean(axis=axes), sample.std(axis=axes)
        view = (1, -1, 1, 1) if train_x.ndim == 4 else (1,)
        self.mean = torch.as_tensor(mean, dtype=torch.float32, device=device).reshape(view)
        self.std = torch.as_tensor(np.maximum(std, 1e-6), dtype=torch.float32, device=device)
        self.std = self.std.reshape(view)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - self.mean) / self.std


class Batches(Protocol):
    def __call__(self, indices: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, labels) on the device for the given sample indices, in order."""
        ...


class DeviceBatches:
    """The whole split resident on the device, normalized once; a batch is an index_select."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        normalize: Normalizer,
        device: torch.device,
        batch_size: int,
    ) -> None:
        self.x = normalize(torch.from_numpy(x).to(device))
        self.y = torch.from_numpy(y).to(device)
        self.batch_size = batch_size

    def __call__(self, indices: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        indices = indices.to(self.x.device)
        for start in range(0, len(indices), self.batch_size):
            batch = indices[start : start + self.batch_size]
            yield self.x.index_select(0, batch), self.y.index_select(0, batch)


def shared_tensor(array: np.ndarray) -> torch.Tensor:
    """`array` copied into shared memory: a process it is then pickled to (a DataLoader worker
    started by forkserver) maps these pages instead of receiving a copy of its own."""
    dtype = torch.from_numpy(np.empty(0, array.dtype.newbyteorder("="))).dtype
    tensor = torch.empty(array.shape, dtype=dtype)
    tensor.share_memory_()  # type: ignore[no-untyped-call]  # in place
    tensor.numpy()[...] = array
    return tensor


class _Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The split, shared by the loader's workers: one copy per rank, however many workers."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = shared_tensor(x), shared_tensor(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


class _IndexSampler(Sampler[int]):
    """Yields the indices set for the current epoch (the sampler lives in the main process)."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class LoaderBatches:
    """A DataLoader with persistent workers; uint8 goes to the device, then is normalized."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        normalize: Normalizer,
        device: torch.device,
        batch_size: int,
        num_workers: int,
    ) -> None:
        self.normalize = normalize
        self.device = device
        self.sampler = _IndexSampler()
        self.loader = DataLoader(
            _Samples(x, y),
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
            # Not fork: by now the process runs the process group's and the intra-op pool's
            # threads, and a child forked from it can hang on a lock one of them held (the
            # likely cause of a rank that once stalled for a minute in its first epoch in the
            # trainer tier). The workers are persistent: a fresh interpreter is paid for once.
            multiprocessing_context=_forkserver() if num_workers > 0 else None,
        )

    def __call__(self, indices: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.indices = indices.tolist()
        for images, labels in self.loader:
            on_device = images.to(self.device, non_blocking=True)
            yield self.normalize(on_device), labels.to(self.device, non_blocking=True)


def _forkserver() -> multiprocessing.context.BaseContext:
    """Workers forked from a server that imported torch once: they share its pages, where
    each worker of a bare server imports torch for itself (about 240 MB apiece)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # no effect once the server runs
    return context


def make_batches(
    x: np.ndarray,
    y: np.ndarray,
    normalize: Normalizer,
    device: torch.device,
    batch_size: int,
    options: TrainerOptions,
) -> Batches:
    """Device-resident batches when the options and the size allow, a DataLoader otherwise."""
    on_device = options.loader == "device" or (
        options.loader == "auto" and x.size * 4 <= DEVICE_BUDGET_BYTES
    )
    if on_device:
        return DeviceBatches(x, y, normalize, device, batch_size)
    return LoaderBatches(x, y, normalize, device, batch_size, options.num_workers)


def augment(x: torch.Tensor, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """Random translation by up to AUGMENT_SHIFT pixels per image (and flips), in one gather."""
    n, _, height, width = x.shape
    shift = AUGMENT_SHIFT
    offsets = torch.randint(0, 2 * shift + 1, (2, n), generator=generator, device=generator.device)
    offsets = offsets.to(x.device)
    rows = offsets[0, :, None] + torch.arange(height, device=x.device)  # (n, height)
    cols = offsets[1, :, None] + torch.arange(width, device=x.device)  # (n, width)
    padded = nn.functional.pad(x, (shift, shift, shift, shift)).permute(
        0, 2, 3, 1
    )  # zero = the mean pixel
    images = torch.arange(n, device=x.device)[:, None, None]
    out = padded[images, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if flip:
        mirrored = torch.rand(n, generator=generator, device=generator.device) < 0.5
        out = torch.where(mirrored.to(x.device)[:, None, None, None], out.flip(3), out)
    return out
