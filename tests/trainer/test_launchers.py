"""The trainer under the HPC launchers users come from, for real: Open MPI's mpirun started with
exactly the launcher command `build_mpijob` renders, and Slurm's srun on a slurmctld and slurmd
started here (Debian's packages, installed by the test set-up where missing)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_ddp.api import load_job
from kube_ddp.builders import BuildSettings
from kube_ddp.launchers.mpi import MPI_RESOLVE_WAIT_S, build_mpijob
from kube_ddp.local.plan import free_port
from tests.host_tools import require
from tests.trainer import support
from tests.unit.support import kubelet_argv, make_job

TARGET = {
    "dataset": "mnist",
    "epochs": 6,
    "targetAccuracy": 0.9,
    "batchSize": 32,
    "lr": 0.05,
    "timeoutSeconds": 60,
}
# Skips anything rsh/ssh is given and runs the command here: each host-file line is then its
# own "node" without an sshd (the MPI Operator's workers run a real one; the e2e tier uses it),
# with its own TMPDIR, as a node has: two orteds sharing one session directory race to make it.
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-F|-i|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
TMPDIR="${TMPDIR:-/tmp}/node-$1"; export TMPDIR; mkdir -p "$TMPDIR"
shift  # the host
exec /bin/sh -c "$*"
"""


def venv_first_path() -> str:
    # The rendered command runs `python`: this environment's, as the image's PATH would give.
    return f"{support.VENV_BIN}{os.pathsep}{os.environ['PATH']}"


# --- Open MPI ---------------------------------------------------------------------------------


def test_mpirun_runs_the_rendered_launcher_command_across_two_hosts(
    idx_data: Path, tmp_path: Path
) -> None:
    """Two "nodes" (127.0.0.2 and .3 in the host file, the way the MPI Operator writes it) of one
    rank each, MASTER_ADDR from the host file's first line, the contract passed on by -x."""
    require("LAUNCHERS")
    summary = tmp_path / "summary.json"
    job = make_job(
        nodes=2,
        launcher="mpi",
        port=free_port(),
        mpi={"socketsPerNode": 1, "coresPerProcess": 1},  # this machine: 1 socket, 2 cores
        trainer={**TARGET, "dataDir": str(idx_data), "summaryFile": str(summary)},
    )
    mpijob = build_mpijob(job, 0, BuildSettings())
    (launcher,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    run = support.run(kubelet_argv(launcher), env=two_hosts_env(tmp_path, 1, launcher)).check()

    result = support.summary(summary)
    assert result["world_size"] == 2
    assert result["stopped_early"] is True
    assert result["val_accuracy"] >= 0.9
    assert "launcher=openmpi" in run.stderr
    # two nodes of one rank each, not one node of two
    assert run.identities() == {
        "rank=0 world_size=2 local_rank=0 local_world_size=1 node_rank=0",
        "rank=1 world_size=2 local_rank=0 local_world_size=1 node_rank=1",
    }


# The Voyager seed's mpirun flags (test16cards_mnist_PT.yaml), as a user pastes them.
SEED_EXTRA_ARGS = [
    *("--bind-to", "core", "--map-by", "ppr:4:socket:PE=6", "-rank-by", "core"),
    *("--report-bindings", "--tag-output", "--merge-stderr-to-stdout", "--prefix", "$MPI_ROOT"),
    *("-x", "MASTER_ADDR=$MASTER_ADDR", "-x", "MASTER_PORT=$MASTER_PORT", "-x", "PYTHONPATH"),
    *("-x", "PT_HPU_LAZY_MODE=1"),
]
GAUDI_EXAMPLE = support.REPO / "manifests" / "examples" / "gaudi-mpi.yaml"
GAUDI_NODE_TOPOLOGY = "pack:2 core:24 pu:1"  # 2 sockets of 24 cores: the PE=6 of the seed


def test_the_seed_s_mpirun_flags_pasted_into_the_gaudi_example_run_under_mpirun(
    tmp_path: Path,
) -> None:
    """The Gaudi example (2 nodes x 8) with the seed's flags in mpi.extraArgs, `$MPI_ROOT` and
    `$MASTER_ADDR` among them: a real mpirun accepts the rendered line and its 16 ranks train,
    over the stand-in hccl (test_gaudi_path.py) passed on by the seed's `-x PYTHONPATH`.
    This machine has one socket of 2 cores, so Open MPI maps by a topology file of a Gaudi
    node (hwloc's synthetic 2 x 24 cores) and binds nothing (rtc ^hwloc): the mapping is
    checked, the binding only on such a node."""
    require("LAUNCHERS")
    document = yaml.safe_load(GAUDI_EXAMPLE.read_text())
    document["spec"]["mpi"]["extraArgs"] = SEED_EXTRA_ARGS
    summary = tmp_path / "summary.json"
    document["spec"]["trainer"] = {
        **{"dataset": "digits", "model": "mlp", "epochs": 2, "device": "cpu"},
        **{"timeoutSeconds": 120, "summaryFile": str(summary)},
    }
    document["spec"]["port"] = free_port()
    mpijob = build_mpijob(load_job(document), 0, BuildSettings())
    (launcher,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    topology = tmp_path / "gaudi-node.xml"
    lstopo = ["lstopo-no-graphics", "--input", GAUDI_NODE_TOPOLOGY, "--of", "xml"]
    topology.write_text(subprocess.run(lstopo, capture_output=True, text=True, check=True).stdout)
    env = two_hosts_env(tmp_path, slots=8, launcher=launcher)
    env.update(
        MPI_ROOT=str(Path(str(shutil.which("mpirun"))).parent.parent),  # Debian's: /usr
        PYTHONPATH=str(Path(__file__).parent / "gaudi_standin"),
        OMPI_MCA_hwloc_base_topo_file=str(topology),
        OMPI_MCA_rtc="^hwloc",
    )
    run = support.run(kubelet_argv(launcher), env=env).check()
    result = support.summary(summary)
    assert (result["world_size"], result["epochs_run"]) == (16, 2)
    said = run.stdout + run.stderr  # --tag-output: "[1,<rank>]<stderr>:..."
    assert "[1,15]<stderr>:ddp_trainer[rank 15]:" in said
    assert said.count("launcher=openmpi backend=hccl device=cpu") == 16
    # ppr:4:socket on a node of 2 sockets: 8 ranks on each of the two hosts
    placements = re.findall(r"local_world_size=(\d+) node_rank=(\d+)", said)
    assert sorted(set(placements)) == [("8", "0"), ("8", "1")]


def two_hosts_env(
    tmp_path: Path, slots: int, launcher: dict[str, Any], hosts: int = 2
) -> dict[str, str]:
    """What the MPI Operator gives a launcher of `hosts` workers (127.0.0.2, .3, ... in its host
    file), with an rsh agent that runs each "host" here, and the launcher container's env."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"127.0.0.{2 + i} slots={slots}\n" for i in range(hosts)))
    agent = tmp_path / "fake-ssh"
    agent.write_text(FAKE_SSH)
    agent.chmod(0o755)
    return support.clean_env(
        PATH=venv_first_path(),
        OMPI_MCA_orte_default_hostfile=str(hostfile),
        OMPI_MCA_orte_keep_fqdn_hostnames="true",
        OMPI_MCA_plm_rsh_agent=str(agent),
        TMPDIR=str(tmp_path),
        **{e["name"]: e["value"] for e in launcher["env"] if "value" in e},
    )


HOROVOD_EXAMPLE = support.REPO / "manifests" / "examples" / "horovod-style-mpi-gpu.yaml"


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 8), (2, 4)])
def test_the_horovod_style_example_runs_under_mpirun_without_binding(
    tmp_path: Path, nodes: int, per_node: int
) -> None:
    """The seed's `mpirun -np 8` on 8 GPUs, 1 node x 8 and 2 x 4: the MPI image picked, the
    ranks unbound and mapped by slot (Horovod's line), 8 ranks trained; on the CPU (gloo) in
    place of the GPUs."""
    require("LAUNCHERS")
    document = yaml.safe_load(HOROVOD_EXAMPLE.read_text())
    document["spec"].update(nodes=nodes, accelerator={"type": "nvidia", "perNode": per_node})
    job = load_job(document)
    mpijob = build_mpijob(job, 0, BuildSettings())
    (launcher,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert launcher["image"].endswith("-mpi")
    words = kubelet_argv(launcher)[2].split()
    assert "--bind-to none --map-by slot" in " ".join(words)
    summary = tmp_path / "summary.json"
    document["spec"].update(
        backend="gloo",  # the stand-in for NCCL here
        port=free_port(),
        trainer={
            **{"dataset": "digits", "model": "mlp", "epochs": 1, "device": "cpu"},
            **{"timeoutSeconds": 120, "summaryFile": str(summary)},
        },
    )
    mpijob = build_mpijob(load_job(document), 0, BuildSettings())
    (launcher,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    env = two_hosts_env(tmp_path, per_node, launcher, hosts=nodes)
    run = support.run(kubelet_argv(launcher), env=env).check()
    assert support.summary(summary)["world_size"] == 8
    placements = set(re.findall(r"local_world_size=(\d+) node_rank=(\d+)", run.stderr))
    assert placements == {(str(per_node), str(node)) for node in range(nodes)}


HOROVOD_SCRIPT_EXAMPLE = support.REPO / "manifests" / "examples" / "horovod"


def test_a_horovod_script_runs_unchanged_under_mpirun_to_the_end(tmp_path: Path) -> None:
    """manifests/examples/horovod: a script of Horovod's API (`import horovod.torch as hvd`,
    DistributedOptimizer, broadcast_parameters, allreduce of its metrics) under the real mpirun
    line its job renders, 2 hosts x 2 ranks on the CPU (gloo for NCCL): it learns, and every
    rank ends with the same weights, so the gradients were averaged over all four."""
    require("LAUNCHERS")
    document = yaml.safe_load((HOROVOD_SCRIPT_EXAMPLE / "job.yaml").read_text())
    script = str(HOROVOD_SCRIPT_EXAMPLE / "train.py")
    assert document["spec"]["command"] == ["python", "/home/trainer/train.py"]
    document["spec"].update(
        accelerator={"type": "nvidia", "perNode": 2},
        backend="gloo",  # the stand-in for NCCL here
        port=free_port(),
        command=["python", script],
        template={},  # the ConfigMap's file is the script itself here
    )
    mpijob = build_mpijob(load_job(document), 0, BuildSettings())
    (launcher,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    run = support.run(kubelet_argv(launcher), env=two_hosts_env(tmp_path, 2, launcher)).check()
    said = run.stdout + run.stderr
    # mpirun forwards the ranks' output in chunks: two lines may share one, neither split
    weights = set(re.findall(r"rank (\d) of 4: weights (-?\d+\.\d+)", said))
    assert {rank for rank, _ in weights} == {"0", "1", "2", "3"}, said[-3000:]
    assert len({value for _, value in weights}) == 1, weights  # one model on every rank
    accuracy = [float(a) for a in re.findall(r"accuracy ([\d.]+)%", said)]
    assert len(accuracy) == 5 and accuracy[-1] > 50 and accuracy[-1] > accuracy[0], said[-3000:]


def launcher_in(
    tmp_path: Path,
    hostfile: str,
    unresolved_tries: int,
    mpi: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **env: str,
) -> subprocess.Popen[str]:
    """The rendered launcher command, after the kubelet's expansion, with `getent` failing its
    first `unresolved_tries` looks for each name (a worker pod not yet created), `sleep`
    instant, and an `mpirun` that says what it was started with."""
    job = make_job(nodes=2, launcher="mpi", **({"mpi": mpi} if mpi else {}), **(spec or {}))
    mpijob = build_mpijob(job, 0, BuildSettings())
    (launcher,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    (tmp_path / "hostfile").write_text(hostfile)
    tools = tmp_path / "bin"
    tools.mkdir()
    fakes = {
        "getent": (  # a name's tries counted in a file of its own
            f'n=$(cat "{tmp_path}/tries.$2" 2>/dev/null || echo 0); '
            f'echo $((n + 1)) > "{tmp_path}/tries.$2"; '
            f'[ "$n" -ge {unresolved_tries} ] && echo "10.0.0.1 $2"'
        ),
        "sleep": "exit 0",
        "mpirun": 'echo "mpirun MASTER_ADDR=$MASTER_ADDR"; printf "[%s]" "$@"',
    }
    for name, body in fakes.items():
        (tools / name).write_text("#!/bin/sh\n" + body + "\n")
        (tools / name).chmod(0o755)
    env = support.clean_env(
        PATH=f"{tools}{os.pathsep}{os.environ['PATH']}",
        OMPI_MCA_orte_default_hostfile=str(tmp_path / "hostfile"),
        **env,
    )
    return subprocess.Popen(
        kubelet_argv(launcher), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


HOSTFILE = (
    "# by the MPI Operator\njob-worker-0.job.ns.svc slots=1\njob-worker-1.job.ns.svc slots=1\n"
)


def test_the_launcher_waits_until_every_worker_resolves(tmp_path: Path) -> None:
    """An MPIJob resumed from suspend starts its launcher with its workers: ssh would give up on
    a name with no record yet, so mpirun starts only once every host resolves."""
    out, err = launcher_in(tmp_path, HOSTFILE, unresolved_tries=3).communicate(timeout=60)
    assert out.startswith("mpirun MASTER_ADDR=job-worker-0.job.ns.svc\n"), err
    for worker in range(2):
        assert (tmp_path / f"tries.job-worker-{worker}.job.ns.svc").read_text() == "4\n"


def test_a_launcher_whose_worker_never_resolves_says_which(tmp_path: Path) -> None:
    launcher = launcher_in(tmp_path, HOSTFILE, unresolved_tries=10**6)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1
    assert out == ""  # mpirun never started
    assert f"job-worker-0.job.ns.svc did not resolve in {MPI_RESOLVE_WAIT_S} s" in err


def test_extra_args_name_the_launcher_s_variables_and_mpi_root_is_the_prefix(
    tmp_path: Path,
) -> None:
    """`$NAME` and `${NAME}` in extraArgs are the launcher's environment, expanded by its shell
    and nothing else (no command substitution, no splitting); MPI_ROOT (Gaudi's images set it)
    is the default --prefix, unless extraArgs give one."""
    mpi = {"extraArgs": ["-x", "LIB=${MPI_ROOT}/lib", "-x", "ODD=$(true) $$HOME a b"]}
    out, err = launcher_in(
        tmp_path, "127.0.0.2 slots=1\n", unresolved_tries=0, mpi=mpi, MPI_ROOT="/opt/mpi x"
    ).communicate(timeout=60)
    assert "[mpirun][--prefix][/opt/mpi x][--allow-run-as-root]" not in out  # mpirun is $0
    assert out.splitlines()[1].startswith("[--prefix][/opt/mpi x][--allow-run-as-root]"), out
    assert "[-x][LIB=/opt/mpi x/lib][-x][ODD=$(true) $HOME a b][python]" in out, err

    given = {"extraArgs": ["--prefix", "/usr/local/openmpi"]}
    (tmp_path / "given").mkdir()
    out, _ = launcher_in(
        tmp_path / "given", "127.0.0.2 slots=1\n", 0, mpi=given, MPI_ROOT="/opt/mpi"
    ).communicate(timeout=60)
    assert "/opt/mpi]" not in out and "[--prefix][/usr/local/openmpi]" in out


def test_a_value_the_kubelet_expands_cannot_run_code_in_the_launcher(tmp_path: Path) -> None:
    """The kubelet puts a variable's value where the command says `$(NAME)`: one with a quote
    (from a ConfigMap, a Secret, an annotation) must reach mpirun as one word, in the program
    and in extraArgs alike, and run nothing in the launcher, which holds the job's token."""
    planted = tmp_path / "pwned"
    evil = f"x' \"$(touch {planted})\" '"
    spec = {
        "env": [{"name": "EVIL", "value": evil}],
        "command": ["python", "train.py", "--run", "$(EVIL)", "$(NOT_SET)"],
    }
    mpi = {"extraArgs": ["-x", "RUN=$(EVIL)"]}
    out, err = launcher_in(tmp_path, "127.0.0.2 slots=1\n", 0, mpi=mpi, spec=spec).communicate(
        timeout=60
    )
    assert not planted.exists(), (out, err)
    # the program's words are the kubelet's to expand, as in any pod; the launcher's own
    # script and extraArgs are not
    assert f"[python][train.py][--run][{evil}][$(NOT_SET)]" in out, err
    assert "[-x][RUN=$(EVIL)]" in out, err


def test_a_variable_the_launcher_lacks_stops_it_naming_the_variable(tmp_path: Path) -> None:
    launcher = launcher_in(
        tmp_path, "127.0.0.2 slots=1\n", 0, mpi={"extraArgs": ["--prefix", "$MPI_ROOT"]}
    )
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1 and out == ""
    assert "MPI_ROOT: not set in the launcher environment, and mpi.extraArgs names it" in err


# --- Slurm ------------------------------------------------------------------------------------


def slurm_conf(directory: Path, host: str) -> str:
    """One node (this machine), auth/none: no munge, nothing written outside `directory`."""
    return "\n".join(
        [
            "ClusterName=kube-ddp-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"SlurmUser={os.environ.get('USER') or 'root'}",
            f"SlurmdUser={os.environ.get('USER') or 'root'}",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"StateSaveLocation={directory / 'state'}",
            f"SlurmdSpoolDir={directory / 'spool'}",
            f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
            f"SlurmdPidFile={directory / 'slurmd.pid'}",
            f"SlurmctldLogFile={directory / 'slurmctld.log'}",
            f"SlurmdLogFile={directory / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 "
            "State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """slurmctld and slurmd on this machine; yields the environment srun needs."""
    require("LAUNCHERS")
    directory = tmp_path_factory.mktemp("slurm")
    (directory / "state").mkdir()
    (directory / "spool").mkdir()
    conf = directory / "slurm.conf"
    conf.write_text(slurm_conf(directory, socket.gethostname()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [
        subprocess.Popen(
            [str(shutil.which(daemon)), "-D", "-f", str(conf)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for daemon in ("slurmctld", "slurmd")
    ]
    try:
        deadline = time.monotonic() + 30
        state = ""
        while state != "idle":
            exited = [d.args[0] for d in daemons if d.poll() is not None]
            if exited or time.monotonic() > deadline:
                logs = "\n".join(p.read_text() for p in directory.glob("*.log"))
                pytest.fail(f"Slurm did not come up (exited: {exited}; node {state!r}):\n{logs}")
            time.sleep(0.2)
            state = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, check=False
            ).stdout.strip()
        yield {"SLURM_CONF": str(conf)}
    finally:
        for daemon in reversed(daemons):  # slurmd first, then slurmctld
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(10)


SBATCH_EXAMPLE = support.REPO / "manifests" / "examples" / "slurm" / "ddp.sbatch"


def test_the_sbatch_example_trains_as_a_batch_job(slurm: dict[str, str], tmp_path: Path) -> None:
    """manifests/examples/slurm/ddp.sbatch as shipped, submitted with `sbatch --wait` to the
    Slurm started here: two tasks train, each with its rank from Slurm, the output where the
    script says."""
    summary = tmp_path / "summary.json"
    env = support.clean_env(PATH=venv_first_path(), EPOCHS="3", **slurm)
    done = subprocess.run(
        ["sbatch", "--wait", "--parsable", str(SBATCH_EXAMPLE), f"--summary-file={summary}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=support.RUN_TIMEOUT_S,
        check=False,
    )
    job_id = done.stdout.strip().split(";")[0]
    output = tmp_path / f"ddp-trainer-{job_id}.out"
    said = output.read_text() if output.exists() else ""
    assert done.returncode == 0, done.stderr + said[-3000:]
    assert support.summary(summary)["world_size"] == 2
    assert "launcher=slurm" in said
    assert list(tmp_path.glob(f"checkpoints-{job_id}/checkpoint-step-*.pt"))


@pytest.mark.parametrize("mpi", [None, "pmi2"])
def test_srun_tasks_per_node_train_to_the_target(
    slurm: dict[str, str], idx_data: Path, tmp_path: Path, mpi: str | None
) -> None:
    """`srun --ntasks-per-node=2` as Taurus users launch; with `--mpi=pmi2` too, which adds
    PMI's variables (the trainer must still read the node layout from Slurm's)."""
    summary = tmp_path / "summary.json"
    args = [
        *("--dataset", "mnist", "--data-dir", str(idx_data), "--epochs", "6"),
        *("--target-accuracy", "0.9", "--batch-size", "32", "--lr", "0.05"),
        *("--timeout-seconds", "60", "--summary-file", str(summary)),
    ]
    srun = ["srun", "--nodes=1", "--ntasks-per-node=2", *([f"--mpi={mpi}"] if mpi else [])]
    env = support.clean_env(PATH=venv_first_path(), MASTER_PORT=str(free_port()), **slurm)
    run = support.run([*srun, *support.trainer_command(*args)], env=env).check()
    result = support.summary(summary)
    assert (result["world_size"], result["stopped_early"]) == (2, True)
    assert result["val_accuracy"] >= 0.9
    assert "launcher=slurm" in run.stderr
    assert run.identities() == {
        "rank=0 world_size=2 local_rank=0 local_world_size=2 node_rank=0",
        "rank=1 world_size=2 local_rank=1 local_world_size=2 node_rank=0",
    }
