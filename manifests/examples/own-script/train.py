"""A plain PyTorch DDP script, as you would write it for one machine, plus a few kube-ddp lines.

torchrun (which kube-ddp starts for `nprocPerNode` > 1) or kube-ddp itself (one process a pod)
sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; `init_process_group` reads
them. It fits a linear model to y = 3x + 1 on data each rank makes for itself.

Three helpers from the trainer image's ddp_trainer package (standard library until used):

- `report` tells kube-ddp where training stands: the job's status gets the step, the
  percentage done and the time left, and runPolicy.progressDeadlineSeconds can tell a hung
  group from a slow one. Outside kube-ddp, and on ranks other than 0, it does nothing.
- `Preemption` turns SIGTERM (a suspend, a Kueue eviction, a node drain: the kubelet's
  notice before it kills the pod) into a stop at a step every rank agrees on: rank 0 saves a
  checkpoint of that step and every rank exits 86, which kube-ddp resumes instead of counting
  a failure. The next run starts after the saved step; `report_checkpoint` puts the save in
  the job's status.
- `log_metrics` writes the curves, from rank 0: TensorBoard event files in `--log-dir` (a
  directory or s3://BUCKET/PREFIX) and an MLflow run when MLFLOW_TRACKING_URI is set. Given
  the step the checkpoint resumed from, a resumed run continues the same TensorBoard line and
  the job's one MLflow run. Without either, it does nothing.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.preemption import Preemption
from ddp_trainer.progress import log_metrics, report, report_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    parser.add_argument("--checkpoint-dir", help="where rank 0 saves on SIGTERM (a volume)")
    parser.add_argument("--log-dir", help="TensorBoard event files: a directory or s3://...")
    args = parser.parse_args()

    preemption = Preemption()  # first: a SIGTERM from here on is handled
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    print(f"rank {rank} of {world} (local rank {local_rank}) on {device}", flush=True)

    torch.manual_seed(rank)
    model = torch.nn.Linear(1, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = os.path.join(args.checkpoint_dir, "checkpoint.pt") if args.checkpoint_dir else None
    done = [0]  # steps trained: rank 0's checkpoint says, every rank follows
    if rank == 0 and checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])  # plain SGD: the same on every rank
        done = [state["step"]]
        print(f"rank 0 resuming after step {done[0]}", flush=True)
    dist.broadcast_object_list(done, src=0)
    model = DistributedDataParallel(model)  # every rank starts from rank 0's weights

    total = args.epochs * args.steps_per_epoch
    for step in range(done[0], total):
        x = torch.rand(64, 1, device=device)
        loss = torch.nn.functional.mse_loss(model(x), 3 * x + 1)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients of all ranks here
        optimizer.step()
        epoch, in_epoch = divmod(step, args.steps_per_epoch)
        report(epoch, in_epoch + 1, args.steps_per_epoch, loss, epochs=args.epochs)
        if (step + 1) % 10 == 0:
            log_metrics(step + 1, {"loss": loss}, log_dir=args.log_dir, resumed_from_step=done[0])
        if preemption.stop_requested():  # every rank, every step: they agree on this one
            print(f"stopping after step {step + 1}: SIGTERM", flush=True)
            if rank == 0 and checkpoint:
                started = time.monotonic()
                state = {
                    "step": step + 1,
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                }
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                torch.save(state, checkpoint + ".tmp")
                os.replace(checkpoint + ".tmp", checkpoint)  # never half a checkpoint
                seconds = time.monotonic() - started  # status.training.checkpoint says it
                report_checkpoint(step + 1, epoch, seconds, resumed_from_step=done[0])
            preemption.exit()  # waits for rank 0, exits 86
    if rank == 0:
        weight, bias = model.module.weight.item(), model.module.bias.item()
        print(f"done: {total} steps on {world} ranks, y = {weight:.2f}x + {bias:.2f}")
    preemption.close()  # its last check's all-reduce, still in flight, before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
