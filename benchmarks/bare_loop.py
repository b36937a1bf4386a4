"""The floor: the fewest operations a training step can be, for the trainer to be measured by.

The data normalised once and held in memory, a fresh shuffle each epoch and each batch gathered
by index (as the trainer batches), then forward, loss, backward and the optimizer's step:
nothing read back, nothing logged, no schedule. Under a launcher (`RANK` set) the model is
wrapped in torch's DDP with its defaults on a gloo or nccl group: what DDP costs a world of one
(the trainer builds neither there). Run it like the trainer (`python -m
benchmarks.bare_loop <trainer options>`); rank 0 prints one JSON line with the training
throughput of the epochs after the first (a world of one: it does not shard).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.datasets import load_dataset
from ddp_trainer.models import build_model
from ddp_trainer.options import TrainerOptions, parse_argv


def main() -> None:
    options = parse_argv(sys.argv[1:], prog="bare-loop")
    grouped = "RANK" in os.environ
    cuda = options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if grouped:
        dist.init_process_group("nccl" if cuda else "gloo")
    if grouped and dist.get_world_size() != 1:
        raise SystemExit("bare-loop: a world of one only (it does not shard the data)")
    torch.manual_seed(options.seed)

    model, optimizer, x, y = setup(options, device)
    if grouped:
        model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    timings = []
    steps = 0
    for _ in range(options.epochs):
        started = time.perf_counter()
        order = torch.randperm(len(y), device=device)
        steps += train_steps(model, optimizer, x, y, order, options.batch_size)
        if cuda:
            torch.cuda.synchronize(device)
        timings.append((len(y), time.perf_counter() - started))
    measured = timings[1:] or timings
    rate = sum(n for n, _ in measured) / sum(seconds for _, seconds in measured)
    print(json.dumps({"images_per_sec": rate, "steps": steps}))
    if grouped:
        dist.destroy_process_group()


def setup(
    options: TrainerOptions, device: torch.device
) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """The model in training mode, its SGD, and the training split normalised once on
    `device` (also benchmarks/step_profile.py's)."""
    splits = load_dataset(options)
    x = torch.as_tensor(splits.train_x, dtype=torch.float32, device=device)
    x = (x - x.mean()) / x.std()
    y = torch.as_tensor(splits.train_y, dtype=torch.int64, device=device)
    model = build_model(options, splits.sample_shape, splits.num_classes).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=options.lr, momentum=options.momentum)
    return model, optimizer, x, y


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    order: torch.Tensor,
    batch_size: int,
) -> int:
    """One pass over `order`, a step a batch: the floor's step (also profiled beside the
    trainer's, benchmarks/step_profile.py). Returns the steps taken."""
    steps = 0
    for begin in range(0, len(order), batch_size):
        index = order[begin : begin + batch_size]
        loss = nn.functional.cross_entropy(
            model(x.index_select(0, index)), y.index_select(0, index)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


if __name__ == "__main__":
    main()
