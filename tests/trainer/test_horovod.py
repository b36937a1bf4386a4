"""`horovod.torch` (trainer_image/horovod) with real torch.distributed: two ranks under
torchrun, each call of Horovod's API checked against what Horovod returns."""

from __future__ import annotations

from pathlib import Path

from tests.trainer import support

CALLS = """
import horovod.torch as hvd
import torch

hvd.init()
r, n = hvd.rank(), hvd.size()
assert (n, hvd.local_size(), hvd.cross_size()) == (2, 2, 1) and hvd.local_rank() == r
x = torch.tensor([float(r + 1)])
assert hvd.allreduce(x).item() == 1.5  # the mean, a new tensor
assert x.item() == r + 1
assert hvd.allreduce(x, op=hvd.Sum).item() == 3.0
assert hvd.allreduce(x, op=hvd.Max).item() == 2.0
assert hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.fp16).dtype == torch.float32
y = torch.tensor([float(r + 1)])
hvd.allreduce_(y, op=hvd.Sum, prescale_factor=2.0)
assert y.item() == 6.0
handle = hvd.allreduce_async(torch.tensor([1.0]), op=hvd.Sum)
assert hvd.synchronize(handle).item() == 2.0
rows = hvd.allgather(torch.full((r + 1, 2), float(r)))  # 1 row from rank 0, 2 from rank 1
assert rows.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
assert hvd.broadcast(torch.tensor([float(r)]), root_rank=1).item() == 1.0
assert hvd.broadcast_object({"rank": r}, root_rank=0) == {"rank": 0}
assert hvd.allgather_object(r) == [0, 1]

model = torch.nn.Linear(3, 1)
torch.nn.init.constant_(model.weight, float(r))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
assert model.weight.sum().item() == 0.0
opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
hvd.broadcast_optimizer_state(opt, root_rank=0)
assert opt.param_groups[0]["lr"] == 0.1
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # takes it as an Optimizer
loss = model(torch.full((4, 3), float(r + 1))).sum()  # a gradient of 4 (r + 1) per weight
loss.backward()
try:
    opt.zero_grad()
except AssertionError:
    pass
else:
    raise SystemExit("zero_grad between backward and step must be refused")
opt.step()  # the mean of 4 and 8: 6 per weight
assert torch.allclose(model.weight, torch.full((1, 3), -0.6)), model.weight
opt.zero_grad()
model(torch.ones(2, 3)).sum().backward()
opt.synchronize()
with opt.skip_synchronize():
    opt.step()
scheduler.step()
print(f"rank {r}: every call as Horovod's", flush=True)
"""


def test_each_call_of_horovods_api_does_what_horovod_does(tmp_path: Path) -> None:
    script = tmp_path / "calls.py"
    script.write_text(CALLS)
    command = [support.TORCHRUN, "--standalone", "--nproc-per-node=2", str(script)]  # a free port
    run = support.run(command, cwd=tmp_path)
    run.check()
    assert run.stdout.count("every call as Horovod's") == 2, run.stdout + run.stderr[-3000:]


def test_a_plain_process_is_a_group_of_one(tmp_path: Path) -> None:
    script = tmp_path / "one.py"
    script.write_text(
        "import horovod.torch as hvd, torch\nhvd.init()\n"
        "assert (hvd.rank(), hvd.size()) == (0, 1)\n"
        "assert hvd.allreduce(torch.tensor([3.0])).item() == 3.0\nprint('alone')\n"
    )
    run = support.run([str(support.VENV_BIN / "python"), str(script)], cwd=tmp_path)
    run.check()
    assert "alone" in run.stdout
