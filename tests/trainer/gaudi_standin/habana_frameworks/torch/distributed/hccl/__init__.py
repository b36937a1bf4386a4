"""`hccl` as an out-of-tree process-group backend, registered on import as Habana's module does.

It forwards to a gloo process group, on CPU, and implements only the collectives torch's
DistributedDataParallel and the trainer call (all-reduce, broadcast, all-gather and barrier),
for HCCL's types only.
Like a backend written against torch's base `Backend`, it keeps no sequence numbers
(`_get_sequence_number_for_group` raises "does not yet support sequence numbers") and has none
of the optional methods (reduce-scatter, all-to-all, coalescing, splitting, point-to-point):
the trainer may rely on none of them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend

NAME = "hccl"


# The types HCCL's collectives take (docs.habana.ai, HCCL C API: float32, bfloat16, float16,
# int32, uint32), and int64, which DDP's own check of the parameters all-gathers: the PyTorch
# bridge carries it. uint8, an object collective's payload, is not among them.
TYPES = {torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64}


def _checked(tensors: Any) -> Any:
    for tensor in tensors if isinstance(tensors, list) else [tensors]:
        if isinstance(tensor, list):
            _checked(tensor)
        elif tensor.dtype not in TYPES:
            raise RuntimeError(f"hccl stand-in: HCCL's collectives take no {tensor.dtype}")
    return tensors


class StandInHccl(Backend):
    def __init__(self, rank: int, size: int, gloo: Any) -> None:
        super().__init__(rank, size)
        self._gloo = gloo

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return NAME

    def allreduce(self, tensors: Any, opts: Any) -> Any:
        return self._gloo.allreduce(_checked(tensors), opts)

    def broadcast(self, tensors: Any, opts: Any) -> Any:
        return self._gloo.broadcast(_checked(tensors), opts)

    def allgather(self, outputs: Any, inputs: Any, opts: Any) -> Any:
        return self._gloo.allgather(outputs, _checked(inputs), opts)

    def barrier(self, opts: Any) -> Any:
        return self._gloo.barrier(opts)


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> StandInHccl:
    return StandInHccl(rank, size, dist.ProcessGroupGloo(store, rank, size, timeout))


dist.Backend.register_backend(NAME, _create, devices=["cpu"])
