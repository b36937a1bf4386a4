"""`horovod.torch` on torch.distributed: init, the ranks, the collectives, broadcast of the
parameters and the optimizer state, and DistributedOptimizer (gradients averaged over every
rank, each as its backward finishes, before the step). Ranks come from whichever launcher
started the process (Open MPI's mpirun, torchrun, Slurm's srun: `ddp_trainer.distributed`);
the backend is kube-ddp's DDP_BACKEND, else nccl on a GPU and gloo elsewhere."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ddp_trainer import contract
from ddp_trainer import distributed as _launchers

# Horovod's reduction operations (horovod.common.basics), as its scripts name them.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_TORCH_OPS = {
    Average: dist.ReduceOp.SUM,
    Sum: dist.ReduceOp.SUM,
    Min: dist.ReduceOp.MIN,
    Max: dist.ReduceOp.MAX,
    Product: dist.ReduceOp.PRODUCT,
}


class _NoCompression:
    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor


class _FP16Compression:
    """Floating tensors sent as float16, the others as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        return (tensor.to(torch.float16) if tensor.is_floating_point() else tensor), tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor.to(dtype) if tensor.dtype != dtype else tensor


class Compression:
    none = _NoCompression
    fp16 = _FP16Compression


class _State:
    world: _launchers.World | None = None  # set by init()


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the group the launcher started (a group of one for a plain process)."""
    if comm is not None or process_sets is not None:
        raise NotImplementedError("hvd.init(comm=..., process_sets=...): one group of all ranks")
    if _State.world is not None:
        return
    world = _launchers.discover_world(os.environ)
    if not dist.is_initialized():
        if world.distributed:
            _launchers.export_world(world, os.environ)
            dist.init_process_group(_backend(), init_method="env://")
        else:  # a plain process: Horovod runs it as a group of one
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    _State.world = world


def _backend() -> str:
    chosen = os.environ.get(contract.DDP_BACKEND)
    return chosen or ("nccl" if torch.cuda.is_available() else "gloo")


def _require() -> _launchers.World:
    if _State.world is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _State.world


def is_initialized() -> bool:
    return _State.world is not None


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    _State.world = None


def rank() -> int:
    _require()
    return dist.get_rank()


def size() -> int:
    _require()
    return dist.get_world_size()


def local_rank() -> int:
    return _require().local_rank


def local_size() -> int:
    return _require().local_world_size


def cross_rank() -> int:
    return _require().node_rank


def cross_size() -> int:
    return size() // local_size()


def is_homogeneous() -> bool:
    return size() % local_size() == 0


def mpi_threads_supported() -> bool:
    return False  # no MPI library in the process: the collectives are torch's


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return dist.is_gloo_available()


def gloo_built() -> bool:
    return dist.is_gloo_available()


def nccl_built() -> int:
    return int(torch.cuda.is_available() and dist.is_nccl_available())


def cuda_built() -> bool:
    return torch.cuda.is_available()


def rocm_built() -> bool:
    return torch.version.hip is not None


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def _op_of(average: bool | None, op: int | None) -> int:
    if average is not None and op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    chosen = op if op is not None else (Sum if average is False else Average)
    if chosen == Adasum:
        raise NotImplementedError("op=hvd.Adasum: use op=hvd.Average (the same mean, plainly)")
    return chosen


class _Handle:
    """An allreduce under way: `synchronize` waits and finishes it."""

    def __init__(
        self, work: Any, sent: torch.Tensor, target: torch.Tensor, dtype: torch.dtype, scale: float
    ) -> None:
        self.work, self.sent, self.target, self.dtype, self.scale = work, sent, target, dtype, scale

    def finish(self, compression: Any = _NoCompression) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
        result = compression.decompress(self.sent, self.dtype)
        if self.scale != 1.0:
            result = result * self.scale
        if result is not self.target:
            self.target.copy_(result)
        return self.target


def _start_allreduce(
    tensor: torch.Tensor,
    op: int,
    prescale: float = 1.0,
    postscale: float = 1.0,
    compression: Any = _NoCompression,
) -> _Handle:
    sent, dtype = compression.compress(tensor)
    if prescale != 1.0:
        sent = sent * prescale if sent is tensor else sent.mul_(prescale)
    work = dist.all_reduce(sent, op=_TORCH_OPS[op], async_op=True) if size() > 1 else None
    scale = postscale / size() if op == Average else postscale
    return _Handle(work, sent, tensor, dtype, scale)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> _Handle:
    return _start_allreduce(tensor, _op_of(average, op), prescale_factor, postscale_factor)


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> _Handle:
    return allreduce_async_(tensor.detach().clone(), *args, **kwargs)


def synchronize(handle: _Handle) -> torch.Tensor:
    return handle.finish()


def poll(handle: _Handle) -> bool:
    return handle.work is None or bool(handle.work.is_completed())


def allreduce_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Reduce `tensor` over every rank in place (the mean, unless op says otherwise)."""
    return synchronize(allreduce_async_(tensor, *args, **kwargs))


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> torch.Tensor:
    """A new tensor: `tensor` reduced over every rank."""
    copy = tensor.detach().clone()
    handle = _start_allreduce(
        copy, _op_of(average, op), prescale_factor, postscale_factor, compression
    )
    return handle.finish(compression)


def grouped_allreduce(
    tensors: Iterable[torch.Tensor], *args: Any, **kwargs: Any
) -> list[torch.Tensor]:
    return [allreduce(t, *args, **kwargs) for t in tensors]


def grouped_allreduce_(
    tensors: Iterable[torch.Tensor], *args: Any, **kwargs: Any
) -> list[torch.Tensor]:
    return [allreduce_(t, *args, **kwargs) for t in tensors]


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension (which may differ)."""
    rows = torch.tensor([tensor.shape[0] if tensor.dim() else 1], device=tensor.device)
    sizes = [torch.zeros_like(rows) for _ in range(size())]
    dist.all_gather(sizes, rows)
    longest = int(max(int(s.item()) for s in sizes))
    flat = tensor.reshape(1) if tensor.dim() == 0 else tensor
    padded = torch.zeros((longest, *flat.shape[1:]), dtype=flat.dtype, device=flat.device)
    padded[: flat.shape[0]] = flat
    gathered = [torch.empty_like(padded) for _ in range(size())]
    dist.all_gather(gathered, padded)
    return torch.cat([g[: int(s.item())] for g, s in zip(gathered, sizes, strict=True)])


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    if size() > 1:
        dist.broadcast(tensor, src=root_rank)
    return tensor


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None
) -> Any:
    holder = [obj if rank() == root_rank else None]
    if size() > 1:
        dist.broadcast_object_list(holder, src=root_rank)
    return holder[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    gathered: list[Any] = [None] * size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(process_set: Any = None) -> None:
    if size() > 1:
        dist.barrier()


def broadcast_parameters(params: Mapping[str, Any] | Iterable[Any], root_rank: int) -> None:
    """Every rank's parameters (a state_dict, or named_parameters()) set to root_rank's."""
    items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
    with torch.no_grad():
        for item in items:
            tensor = item[1] if isinstance(item, tuple) else item
            if isinstance(tensor, torch.Tensor):
                broadcast_(
                    tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor, root_rank
                )


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Every rank's optimizer state (and hyperparameters) set to root_rank's."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the user's optimizer class (as Horovod does): each gradient is reduced over
    every rank as its backward finishes, and step() waits for them all."""

    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: Any,
        backward_passes_per_step: int,
        op: int,
        gradient_predivide_factor: float,
    ) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]  # the user's class
        self._compression = compression
        self._passes = backward_passes_per_step
        self._op = _op_of(None, op)
        self._predivide = gradient_predivide_factor
        self._handles: dict[torch.Tensor, _Handle] = {}
        self._counts: dict[torch.Tensor, int] = {}
        self._should_synchronize = True
        self._synchronized = False
        if size() > 1:
            for group in self.param_groups:
                for parameter in group["params"]:
                    if parameter.requires_grad:
                        parameter.register_post_accumulate_grad_hook(self._reduce_when_ready)

    def _scales(self) -> tuple[float, float]:
        if self._op == Average:
            return 1.0 / self._predivide, self._predivide
        return 1.0, 1.0

    def _reduce_when_ready(self, parameter: torch.Tensor) -> None:
        self._counts[parameter] = self._counts.get(parameter, 0) + 1
        if self._counts[parameter] < self._passes or parameter.grad is None:
            return
        if parameter in self._handles:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "optimizer.step() or optimizer.synchronize()"
            )
        prescale, postscale = self._scales()
        self._handles[parameter] = _start_allreduce(
            parameter.grad, self._op, prescale, postscale, self._compression
        )

    def synchronize(self) -> None:
        """Wait for every gradient's reduction (and start those no hook started)."""
        if size() > 1:
            prescale, postscale = self._scales()
            for group in self.param_groups:
                for parameter in group["params"]:
                    if parameter.grad is not None and parameter not in self._handles:
                        self._handles[parameter] = _start_allreduce(
                            parameter.grad, self._op, prescale, postscale, self._compression
                        )
            for handle in self._handles.values():
                handle.finish(self._compression)
        self._handles.clear()
        self._counts.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize()"
            )
        super(self.__class__, self).zero_grad(set_to_none)


def DistributedOptimizer(  # noqa: N802, PLR0913  (Horovod's name and signature)
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
) -> torch.optim.Optimizer:
    """`optimizer`, its class extended so that step() uses gradients averaged over every rank."""
    cls = type(
        optimizer.__class__.__name__,
        (optimizer.__class__,),
        {
            k: v
            for k, v in _DistributedOptimizer.__dict__.items()
            if k not in ("__dict__", "__weakref__")
        },
    )
    distributed: torch.optim.Optimizer = cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
    )
    return distributed
