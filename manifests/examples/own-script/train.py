"""A plain PyTorch DDP script, as you would write it for one machine, plus one kube-ddp line.

torchrun (which kube-ddp starts for `nprocPerNode` > 1) or kube-ddp itself (one process a pod)
sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; `init_process_group` reads
them. It fits a linear model to y = 3x + 1 on data each rank makes for itself.

`report` (in the trainer image's ddp_trainer package, standard library only) tells kube-ddp
where training stands: the job's status gets the step, the percentage done and the time left,
and runPolicy.progressDeadlineSeconds can tell a hung group from a slow one. Outside kube-ddp,
and on ranks other than 0, it does nothing.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.progress import report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    args = parser.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    print(f"rank {rank} of {world} (local rank {local_rank}) on {device}", flush=True)

    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(1, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for step in range(args.steps_per_epoch):
            x = torch.rand(64, 1, device=device)
            loss = torch.nn.functional.mse_loss(model(x), 3 * x + 1)
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients of all ranks here
            optimizer.step()
            report(epoch, step + 1, args.steps_per_epoch, loss, epochs=args.epochs)
    if rank == 0:
        weight, bias = model.module.weight.item(), model.module.bias.item()
        steps = args.epochs * args.steps_per_epoch
        print(f"done: {steps} steps on {world} ranks, y = {weight:.2f}x + {bias:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
