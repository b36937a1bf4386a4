"""A Horovod script as Horovod's PyTorch tutorial writes one (pytorch_mnist.py): init, pin a
GPU by local rank, shard the data by rank, broadcast the parameters and the optimizer state,
wrap the optimizer, average the metrics. It runs unchanged on the trainer image, whose
`horovod.torch` is Horovod's API on torch.distributed (docs/mpi.md, "Horovod scripts"). The
one change from the tutorial: scikit-learn's bundled digits instead of a torchvision download,
so that it runs with nothing to fetch."""

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F  # noqa: N812  (the tutorial's name)
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--fp16-allreduce", action="store_true")
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.set_num_threads(1)

digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
labels = torch.tensor(digits.target)
train = TensorDataset(images[:1500], labels[:1500])
test = TensorDataset(images[1500:], labels[1500:])
train_sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = DataLoader(train, batch_size=args.batch_size, sampler=train_sampler)
test_sampler = DistributedSampler(test, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
test_loader = DataLoader(test, batch_size=args.batch_size, sampler=test_sampler)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


model = Net().to(device)
# Horovod's rule: the learning rate scales with the number of workers.
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average
)


def metric_average(value: float, name: str) -> float:
    return float(hvd.allreduce(torch.tensor(value), name=name).item())


for epoch in range(1, args.epochs + 1):
    model.train()
    train_sampler.set_epoch(epoch)
    for batch, batch_labels in train_loader:
        data, target = batch.to(device), batch_labels.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    model.eval()
    test_loss, correct = 0.0, 0.0
    with torch.no_grad():
        for batch, batch_labels in test_loader:
            data, target = batch.to(device), batch_labels.to(device)
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += float((output.argmax(1) == target).sum().item())
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(
            f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {100 * accuracy:.1f}%", flush=True
        )

# Every rank holds the same weights after the last step: say so, as a check.
checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
print(f"rank {hvd.rank()} of {hvd.size()}: weights {checksum:.6f}", flush=True)
