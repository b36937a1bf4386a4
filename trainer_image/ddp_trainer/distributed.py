"""Where this process sits in the job, whoever launched it, and the device and process group.

torchrun and the operator's one-process pods set RANK/WORLD_SIZE/LOCAL_RANK directly; mpirun
(Open MPI, MVAPICH, MPICH/Intel MPI) and Slurm's srun set their own variables, and give no
MASTER_ADDR, which then comes from the host file. `discover_world` reads any of them into one
`World`; `export_world` writes the torch names back so `init_process_group("env://")` works.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_trainer import capabilities, contract
from ddp_trainer.errors import TrainerError

log = logging.getLogger("ddp_trainer")


@dataclass(frozen=True)
class World:
    """This process's place in the job."""

    launcher: str  # torchrun, env, openmpi, mvapich, pmi, slurm, or none (a plain process)
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = contract.DEFAULT_PORT

    @property
    def distributed(self) -> bool:
        """Started by a launcher (torchrun, mpirun, srun, the operator's pods), even alone."""
        return self.launcher != "none"

    @property
    def has_peers(self) -> bool:
        """Other ranks to talk to: only then a process group and DDP. A world of one steps
        the bare model (a group and DDP's reducer cost it half a step again, and change
        nothing: its gradients are its own)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def node_rank(self) -> int:
        return self.rank // self.local_world_size


@dataclass(frozen=True)
class _Launcher:
    name: str
    marker: str  # present only under this launcher
    rank: str
    world_size: str
    local_rank: tuple[str, ...]
    local_world_size: tuple[str, ...]


# Probed in this order: torch's own names win, so `-x RANK` under mpirun is honoured.
_LAUNCHERS = (
    _Launcher(
        "env",
        contract.RANK,
        contract.RANK,
        contract.WORLD_SIZE,
        (contract.LOCAL_RANK,),
        (contract.LOCAL_WORLD_SIZE,),
    ),
    _Launcher(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    _Launcher(
        "mvapich",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        ("MV2_COMM_WORLD_LOCAL_RANK",),
        ("MV2_COMM_WORLD_LOCAL_SIZE",),
    ),
    _Launcher(
        "pmi",
        "PMI_RANK",
        "PMI_RANK",
        "PMI_SIZE",
        ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
        ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
    ),
    # SLURM_STEP_ID: set for srun tasks, not in the batch script itself (one process).
    _Launcher(
        "slurm",
        "SLURM_STEP_ID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        ("SLURM_LOCALID",),
        ("SLURM_NTASKS_PER_NODE",),
    ),
)

# Where mpirun's host file is named (Open MPI 4 / 5, MPICH and Intel MPI's Hydra), then the
# path the Kubeflow MPI Operator mounts.
_HOSTFILE_VARIABLES = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_prte_default_hostfile",
    "PRTE_MCA_prte_default_hostfile",
    "HYDRA_HOST_FILE",
    "I_MPI_HYDRA_HOST_FILE",
)
_MPI_OPERATOR_HOSTFILE = "/etc/mpi/hostfile"


def discover_world(env: Mapping[str, str]) -> World:
    """Rank, world size, local rank and rendezvous address from any supported launcher."""
    launcher = next((launcher for launcher in _LAUNCHERS if launcher.marker in env), None)
    if launcher is None:
        return World(launcher="none")
    if launcher.name == "pmi" and _srun_started_the_ranks(env):
        launcher = _LAUNCHERS[-1]  # Slurm knows the local ranks and the nodes; PMI does not
    name = launcher.name
    if name == "env" and "TORCHELASTIC_RUN_ID" in env:
        name = "torchrun"
    rank = _int(env, launcher.rank)
    world_size = _int(env, launcher.world_size)
    local_world_size = _first_int(env, launcher.local_world_size)
    local_rank = _first_int(env, launcher.local_rank)
    if local_world_size is None:
        # Unknown node size: assume one node, which is all a single host file line can say.
        local_world_size = world_size if local_rank is None else max(local_rank + 1, 1)
    if local_rank is None:
        local_rank = rank % local_world_size
    if not (0 <= rank < world_size and 0 <= local_rank < local_world_size):
        raise TrainerError(
            f"inconsistent {name} environment: rank {rank}, world size {world_size}, "
            f"local rank {local_rank}, local world size {local_world_size}"
        )
    return World(
        launcher=name,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=env.get(contract.MASTER_ADDR)
        or _master_from_hosts(env, world_size, local_world_size),
        master_port=_int(env, contract.MASTER_PORT)
        if env.get(contract.MASTER_PORT)
        else contract.DEFAULT_PORT,
    )


def _srun_started_the_ranks(env: Mapping[str, str]) -> bool:
    """`srun --mpi=pmi2`: every rank is a Slurm task, so Slurm's variables describe it fully.
    (mpirun under Slurm starts one task per node instead, and its PMI ranks count on.)"""
    return (
        "SLURM_STEP_ID" in env
        and env.get("SLURM_NTASKS") == env.get("PMI_SIZE")
        and env.get("SLURM_PROCID") == env.get("PMI_RANK")
    )


def export_world(world: World, env: MutableMapping[str, str]) -> None:
    """Write the torch.distributed names (read by env:// and by vendor plugins such as HCCL)."""
    env.update(
        {
            contract.RANK: str(world.rank),
            contract.WORLD_SIZE: str(world.world_size),
            contract.LOCAL_RANK: str(world.local_rank),
            contract.LOCAL_WORLD_SIZE: str(world.local_world_size),
            contract.MASTER_ADDR: world.master_addr,
            contract.MASTER_PORT: str(world.master_port),
        }
    )


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except KeyError:
        raise TrainerError(f"{name} is not set") from None
    except ValueError:
        raise TrainerError(f"{name} must be an integer, got {env[name]!r}") from None


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = env.get(name, "")
        # Slurm writes SLURM_NTASKS_PER_NODE as e.g. "4" or "4(x2)": the leading number counts.
        match = re.match(r"\d+", value)
        if match:
            return int(match.group())
    return None


def _master_from_hosts(env: Mapping[str, str], world_size: int, local_world_size: int) -> str:
    """MASTER_ADDR when the launcher gave none: the first host of the job's host list."""
    for variable in _HOSTFILE_VARIABLES:
        if env.get(variable):
            return first_host_in_hostfile(Path(env[variable]))
    if Path(_MPI_OPERATOR_HOSTFILE).is_file():
        return first_host_in_hostfile(Path(_MPI_OPERATOR_HOSTFILE))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodelist:
        return first_host_in_nodelist(nodelist)
    if world_size == local_world_size:
        return "127.0.0.1"  # every rank is on this node
    raise TrainerError(
        "MASTER_ADDR is not set and no host file names the first node: export MASTER_ADDR "
        "(mpirun -x MASTER_ADDR) or point OMPI_MCA_orte_default_hostfile at the host file"
    )


def first_host_in_hostfile(path: Path) -> str:
    """The first host of an MPI host file (`host slots=4`, `host:4` or `host`, # comments)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TrainerError(f"cannot read the MPI host file {path}: {exc}") from None
    for line in lines:
        words = line.split("#", 1)[0].split()
        if words:
            return words[0].split(":", 1)[0]
    raise TrainerError(f"the MPI host file {path} names no host")


def first_host_in_nodelist(nodelist: str) -> str:
    """The first host of a Slurm node list: `gpu[07-09,12],cpu1` -> `gpu07`."""
    match = re.match(r"([^,\[]+)(?:\[([^\]\-,]+))?", nodelist.strip())
    if not match:
        raise TrainerError(f"cannot read the Slurm node list {nodelist!r}")
    return match.group(1) + (match.group(2) or "")


# --- device and process group ---------------------------------------------------------------


def habana_installed() -> bool:
    return importlib.util.find_spec("habana_frameworks") is not None


def pick_device(choice: str, world: World, env: Mapping[str, str]) -> torch.device:
    """One process per accelerator: the local rank picks it."""
    chosen = capabilities.device_type(choice, habana_installed(), torch.cuda.is_available())
    if chosen == "cuda":
        index = capabilities.cuda_index(
            world.local_rank,
            world.local_world_size,
            torch.cuda.device_count(),
            capabilities.gpu_per_process(env),
        )
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if chosen == "hpu":
        # registers the hpu device; Habana maps each local rank to a Gaudi of its own
        import habana_frameworks.torch.core  # type: ignore[import-not-found]  # noqa: F401

        return torch.device("hpu")
    return torch.device("cpu")


def resolve_precision(choice: str, device: torch.device) -> str:
    """bf16 where the device computes it natively, fp16 with loss scaling on older GPUs."""
    native_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    return capabilities.precision(choice, device.type, native_bf16)


def backend_for(device: torch.device, env: Mapping[str, str]) -> str:
    """DDP_BACKEND when set (the operator's contract), else the device's own collective library."""
    return env.get(contract.DDP_BACKEND) or {"cuda": "nccl", "hpu": "hccl"}.get(device.type, "gloo")


def init_process_group(
    world: World, device: torch.device, backend: str, timeout_s: int, env: Mapping[str, str]
) -> None:
    if backend == "hccl":
        # registers the hccl backend
        import habana_frameworks.torch.distributed.hccl  # type: ignore[import-not-found]  # noqa: F401
    _make_flight_recorder_dir(env)
    timeout = timedelta(seconds=timeout_s)
    store = _restart_safe_store(world, env, timeout)
    dist.init_process_group(
        backend,
        init_method=None if store else "env://",
        store=store,
        rank=world.rank,
        world_size=world.world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )


@contextlib.contextmanager
def cpu_group(timeout: timedelta, backend: str | None = None) -> Iterator[Any]:
    """A gloo group of every rank, for host-memory collectives with a timeout of their own;
    the default group itself (None) where it is gloo already (`backend`)."""
    if backend == "gloo":
        yield None
        return
    group = dist.new_group(backend="gloo", timeout=timeout)
    try:
        yield group
    finally:
        dist.destroy_process_group(group)


def _make_flight_recorder_dir(env: Mapping[str, str]) -> None:
    """torch writes its flight-recorder dumps to this prefix but creates no directory."""
    prefix = env.get(contract.FLIGHT_RECORDER_FILE)
    if not prefix:
        return
    try:
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a trace lost, not a reason to stop training
        log.warning("no flight-recorder dumps at %s: %s", prefix, exc)


def _restart_safe_store(world: World, env: Mapping[str, str], timeout: timedelta) -> Any:
    """A store without the keys of torchrun's previous attempt, where one is needed.

    torchrun's ranks share its agents' store across restarts (contract.OWN_WORKER_STORE_ENV
    says why that fails). On one node the restart count is the group's, and prefixing the keys
    with it is safe; across nodes the agents may count differently, and only that setting helps.
    """
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or restart == 0:
        return None
    if world.world_size != world.local_world_size:
        log.warning(
            "torchrun restart %d with its shared store: if the group fails to connect, run "
            "torchrun with %s=1 (pytorch/pytorch#135712)",
            restart,
            contract.OWN_WORKER_STORE_ENV,
        )
        return None
    agent_store = dist.TCPStore(  # type: ignore[attr-defined]
        world.master_addr, world.master_port, world.world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"ddp_trainer/attempt_{restart}", agent_store)  # type: ignore[attr-defined]


def set_cpu_threads(world: World, env: Mapping[str, str]) -> None:
    """Share the CPU cores among this node's processes unless OMP_NUM_THREADS says otherwise.

    torchrun sets OMP_NUM_THREADS=1 for several processes; mpirun and srun set nothing, and
    torch's default of one thread per core in every process oversubscribes the node.
    """
    if contract.CPU_THREADS_ENV in env:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // world.local_world_size))


def lazy_mode_step_marker(device: torch.device) -> Callable[[], None]:
    """Gaudi's lazy mode runs the queued graph at mark_step(); elsewhere a no-op."""
    if device.type == "hpu" and capabilities.gaudi_lazy(
        _habana_reports_lazy(), os.environ.get("PT_HPU_LAZY_MODE")
    ):
        import habana_frameworks.torch.core as htcore

        mark_step: Callable[[], None] = htcore.mark_step
        return mark_step
    return _no_op


def _habana_reports_lazy() -> bool | None:
    try:
        from habana_frameworks.torch.utils.internal import (  # type: ignore[import-not-found]
            is_lazy,
        )
    except ImportError:
        return None
    return bool(is_lazy())


def _no_op() -> None:
    pass


def synchronize(device: torch.device) -> None:
    """Wait for queued device work: once per epoch, for honest timings."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "hpu":
        torch.hpu.synchronize()  # type: ignore[attr-defined]


class ComputeClock:
    """The time of the part of a step a rank does alone (its forward pass), for the straggler
    check (`culprit.Ledger.timed`). On a CPU the host's time. On CUDA the GPU's own, from a pair
    of events a step, read once done (`query`), so nothing waits for the device: a GPU-bound
    rank's device runs steps behind its host, so up to IN_FLIGHT pairs wait their turn, and
    while that many do, a step goes untimed (the oldest are kept: they finish first). Elsewhere
    (Gaudi's lazy mode builds its graph on the host) the host's time: a slow host shows there,
    a slow card does not."""

    IN_FLIGHT = 32  # far past the steps a device lags (its launch queue blocks the host first)

    def __init__(self, device: torch.device, event: Callable[[], Any] | None = None) -> None:
        """`event`: a timing event's maker (CUDA's by default; a test's own)."""
        self.on_device = device.type == "cuda" or event is not None
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
        self.began = 0.0
        self.begin: Any = None
        self.pending: collections.deque[tuple[Any, Any]] = collections.deque()

    def start(self) -> None:
        if not self.on_device:
            self.began = time.perf_counter()
        elif len(self.pending) < self.IN_FLIGHT:
            self.begin = self.event()
            self.begin.record()

    def lap(self) -> float | None:
        """Seconds since `start` (on a device: of the newest step it has finished, once)."""
        if not self.on_device:
            return time.perf_counter() - self.began
        if self.begin is not None:
            end = self.event()
            end.record()
            self.pending.append((self.begin, end))
            self.begin = None
        newest = None
        while self.pending and self.pending[0][1].query():
            newest = self.pending.popleft()
        if newest is None:
            return None
        return float(newest[0].elapsed_time(newest[1])) / 1000
