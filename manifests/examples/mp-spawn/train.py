"""The PyTorch tutorial's single-node DDP script as its readers have it: the script starts its
own ranks with torch.multiprocessing.spawn, one per visible GPU, and sets MASTER_ADDR to
localhost itself. Nothing kube-ddp-specific; on a machine without a GPU it spawns 2 ranks on
gloo, so it runs as shipped on a CPU too."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817  (the tutorial's name)


def train(rank: int, world_size: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    model = DDP(torch.nn.Linear(32, 4).to(device), device_ids=[rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(50):
        optimizer.zero_grad()
        inputs = torch.randn(16, 32, device=device)
        loss = model(inputs).square().mean()
        loss.backward()
        optimizer.step()
    print(f"rank {rank} of {world_size}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count() or 2
    mp.spawn(train, args=(world_size,), nprocs=world_size)
