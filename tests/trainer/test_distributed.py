"""Where a process sits, from each launcher's variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddp_trainer.distributed import (
    World,
    backend_for,
    discover_world,
    export_world,
    first_host_in_hostfile,
    first_host_in_nodelist,
)
from ddp_trainer.errors import TrainerError


def test_a_plain_process_is_a_world_of_one_without_a_group() -> None:
    world = discover_world({})
    assert world == World(launcher="none")
    assert not world.distributed and not world.has_peers


def test_torchrun() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "job-worker-0.job.ns.svc",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "abc",
    }
    world = discover_world(env)
    assert world == World("torchrun", 5, 8, 1, 4, "job-worker-0.job.ns.svc", 29400)
    assert world.node_rank == 1
    assert world.distributed and world.has_peers
    one = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    alone = discover_world({**env, **one})
    assert alone.distributed and not alone.has_peers  # launched, but no group to build


def test_operators_single_process_pods_set_the_torch_names_directly() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    world = discover_world({**env, "MASTER_ADDR": "job-worker-0.job.ns.svc"})
    assert (world.launcher, world.rank, world.node_rank, world.master_port) == ("env", 2, 2, 29500)


def test_open_mpi_takes_the_master_from_the_host_file(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# MPI operator\n\njob-worker-0.job.ns.svc slots=4\njob-worker-1 slots=4\n")
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "OMPI_MCA_orte_default_hostfile": str(hostfile),
    }
    world = discover_world(env)
    assert world == World("openmpi", 6, 8, 2, 4, "job-worker-0.job.ns.svc", 29500)
    assert world.node_rank == 1
    assert discover_world({**env, "MASTER_ADDR": "10.0.0.9"}).master_addr == "10.0.0.9"


def test_mpi_on_one_node_needs_no_host_file() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    world = discover_world(env)
    assert (world.local_rank, world.local_world_size, world.master_addr) == (1, 2, "127.0.0.1")


def test_mpi_across_nodes_without_master_or_host_file_is_a_clear_error() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    with pytest.raises(TrainerError, match="MASTER_ADDR is not set"):
        discover_world(env)


def test_intel_mpi_and_mpich() -> None:
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    world = discover_world({**env, "MASTER_ADDR": "head"})
    assert (world.launcher, world.rank, world.local_rank, world.node_rank) == ("pmi", 3, 1, 1)


# Task 5 of `srun --nodes=3 --ntasks-per-node=2`.
SRUN_TASK = {
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "6",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS_PER_NODE": "2(x3)",
    "SLURM_STEP_NODELIST": "gpu[07-09]",
}


def test_slurm_srun_tasks() -> None:
    assert discover_world(SRUN_TASK) == World("slurm", 5, 6, 1, 2, "gpu07", 29500)


def test_srun_with_pmi2_is_read_as_slurm_which_knows_the_nodes() -> None:
    """`srun --mpi=pmi2` adds PMI_RANK/PMI_SIZE but no local rank: PMI alone would take all
    six ranks for one node."""
    env = {**SRUN_TASK, "PMI_RANK": "5", "PMI_SIZE": "6", "PMI_FD": "7"}
    assert discover_world(env) == World("slurm", 5, 6, 1, 2, "gpu07", 29500)
    # mpirun (Hydra) under Slurm: one Slurm task per node, PMI ranks across them
    hydra = {**env, "SLURM_PROCID": "1", "SLURM_NTASKS": "3", "PMI_RANK": "3"}
    assert discover_world({**hydra, "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}).launcher == (
        "pmi"
    )


def test_a_slurm_batch_script_is_one_plain_process() -> None:
    assert discover_world({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}).launcher == "none"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("gpu[07-09,12],cpu1", "gpu07"), ("node1,node2", "node1"), ("a-b[3]", "a-b3"), ("x", "x")],
)
def test_first_host_of_a_slurm_node_list(nodelist: str, first: str) -> None:
    assert first_host_in_nodelist(nodelist) == first


@pytest.mark.parametrize("line", ["host-a slots=2", "host-a:2", "  host-a  # first"])
def test_first_host_of_a_host_file(tmp_path: Path, line: str) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# comment\n{line}\nhost-b\n")
    assert first_host_in_hostfile(hostfile) == "host-a"


def test_inconsistent_launcher_variables_are_a_clear_error() -> None:
    with pytest.raises(TrainerError, match="inconsistent"):
        discover_world({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(TrainerError, match="WORLD_SIZE must be an integer"):
        discover_world({"RANK": "0", "WORLD_SIZE": "two"})


def test_export_world_writes_the_names_env_init_reads() -> None:
    env: dict[str, str] = {}
    export_world(World("openmpi", 1, 2, 1, 2, "head", 1234), env)
    assert env == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "head",
        "MASTER_PORT": "1234",
    }


def test_backend_follows_the_device_unless_ddp_backend_says_otherwise() -> None:
    assert backend_for(torch.device("cpu"), {}) == "gloo"
    assert backend_for(torch.device("cuda", 1), {}) == "nccl"
    assert backend_for(torch.device("cpu"), {"DDP_BACKEND": "mpi"}) == "mpi"
