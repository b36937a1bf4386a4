"""The baseline: a DDP training loop written the way the PyTorch tutorials write it.

A Dataset that converts and normalizes one sample at a time (ToTensor + Normalize), a
DataLoader with a DistributedSampler, fp32, plain SGD, and `loss.item()` after every step for
the running loss. On a GPU (`--device=cuda`, or auto with one visible) it does what the DDP
tutorial's multigpu.py does: nccl, one device per local rank, a pinned DataLoader and each
batch copied with `.to(device)`. The data and the model come from ddp_trainer, so only the
loop differs.
Run it like the trainer (`torchrun ... -m benchmarks.reference_loop <trainer options>`); rank 0
prints one JSON line with the training throughput of the epochs after the first.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ddp_trainer.datasets import load_dataset
from ddp_trainer.models import build_model
from ddp_trainer.options import parse_argv


class TutorialDataset(Dataset[tuple[torch.Tensor, int]]):
    """One sample per __getitem__, normalized there, as transforms.Normalize would."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y
        self.mean, self.std = float(x.mean()), float(x.std())

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        sample = torch.from_numpy(np.asarray(self.x[index], dtype=np.float32))
        return (sample - self.mean) / self.std, int(self.y[index])


def main() -> None:
    options = parse_argv(sys.argv[1:], prog="reference-loop")
    distributed = "RANK" in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(options.seed)

    splits = load_dataset(options)
    dataset = TutorialDataset(splits.train_x, splits.train_y)
    sampler = DistributedSampler(dataset) if distributed else None
    loader = DataLoader(
        dataset,
        batch_size=options.batch_size,
        sampler=sampler,
        shuffle=sampler is None,
        pin_memory=cuda,
    )
    model: nn.Module = build_model(options, splits.sample_shape, splits.num_classes).to(device)
    if distributed:
        model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=options.lr, momentum=options.momentum)

    timings = []
    for epoch in range(options.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        started, images, running_loss = time.perf_counter(), 0, 0.0
        for batch, target in loader:
            x, y = batch.to(device, non_blocking=True), target.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            images += len(y)
        timings.append((images * world_size, time.perf_counter() - started))
    measured = timings[1:] or timings
    if rank == 0:
        rate = sum(n for n, _ in measured) / sum(seconds for _, seconds in measured)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
        print(
            json.dumps(
                {
                    "images_per_sec": rate,
                    "loss": running_loss / len(loader),
                    "peak_device_memory_mib": peak,
                }
            )
        )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
