"""The torchrun tutorial's script as its readers have it: ResNet-18 from torchvision on CIFAR-10,
DistributedSampler, DDP, the ranks from torchrun's environment (LOCAL_RANK, RANK, WORLD_SIZE).
Two changes, both said where they are: the backend follows the machine (the tutorial's "nccl"
needs a GPU; `kube-ddp run --local --cpu` runs it on gloo), and torchvision's FakeData of
CIFAR-10's shape stands in for the download (a pod without internet; put the tutorial's line
back where the pods can reach it). Nothing kube-ddp-specific: kube-ddp starts it under torchrun
with the rendezvous of the job, so the script only calls init_process_group."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817  (the tutorial's name)
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models, transforms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()  # the tutorial: dist.init_process_group(backend="nccl")
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    transform = transforms.Compose(
        [
            transforms.ToTensor(),
            transforms.Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)),
        ]
    )
    # The tutorial: datasets.CIFAR10(root="./data", train=True, download=True, transform=transform)
    dataset = datasets.FakeData(args.samples, (3, 32, 32), num_classes=10, transform=transform)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = models.resnet18(num_classes=10).to(device)
    model = DDP(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for source, targets in loader:
            images, labels = source.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
        print(f"rank {dist.get_rank()} epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
