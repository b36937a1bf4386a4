"""A plain PyTorch DDP script, as you would write it for one machine: no kube-ddp import.

torchrun (which kube-ddp starts for `nprocPerNode` > 1) or kube-ddp itself (one process a pod)
sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; `init_process_group` reads
them. It fits a linear model to y = 3x + 1 on data each rank makes for itself.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    print(f"rank {rank} of {world} (local rank {local_rank}) on {device}", flush=True)

    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(1, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.rand(64, 1, device=device)
        loss = torch.nn.functional.mse_loss(model(x), 3 * x + 1)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients of all ranks here
        optimizer.step()
    if rank == 0:
        weight, bias = model.module.weight.item(), model.module.bias.item()
        print(f"done: {args.steps} steps on {world} ranks, y = {weight:.2f}x + {bias:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
