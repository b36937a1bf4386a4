"""From a job to local processes: the job fitted to this machine, and each worker pod's
container turned into a command line and an environment, the way the kubelet would start it.

What differs from a cluster, on purpose and only here: the workers' DNS names resolve to
127.0.0.1, the rendezvous port is a free one, each pod sees only its own GPUs, the Python
environment running kube-ddp comes first on PATH (so a pod's `python` and `torchrun` are this
environment's), and the trainer reports progress to the runner instead of the API server.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ddp_trainer import contract
from kube_ddp import names
from kube_ddp.api import DDPTrainingJob, load_job
from kube_ddp.builders import BuildSettings
from kube_ddp.expansion import container_argv, resolve_env
from kube_ddp.jobfile import describe_errors
from kube_ddp.launchers import build_children

LOCALHOST = "127.0.0.1"
LOWEST_PORT = 20000  # of a rendezvous port: above what system services commonly listen on
# Inherited from the shell, these would tell a worker it runs under another launcher or job.
FOREIGN_ENV_PREFIXES = ("TORCHELASTIC_", "PET_", "OMPI_", "PMI_", "MV2_", "SLURM_", "KUBEDDP_")
FOREIGN_ENV = frozenset({*names.RESERVED_ENV, "KUBERNETES_SERVICE_HOST", "GROUP_RANK"})


class LocalRunError(Exception):
    """The job cannot run on this machine as it is; the message says what to change."""


@dataclass(frozen=True)
class Overrides:
    """Command-line changes that fit a job to this machine (validated like the file)."""

    nodes: int | None = None
    nproc_per_node: int | None = None
    cpu: bool = False


@dataclass(frozen=True)
class Machine:
    """What this machine offers the workers."""

    gpus: tuple[str, ...]  # CUDA device ids a process may be given
    cpus: int

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> Machine:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        return cls(gpus=visible_gpus(env), cpus=cpus or os.cpu_count() or 1)


def visible_gpus(env: Mapping[str, str]) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES when set (as CUDA reads it), else the GPUs nvidia-smi lists."""
    if contract.VISIBLE_GPUS_ENV in env:
        visible = env[contract.VISIBLE_GPUS_ENV]
        return tuple(d.strip() for d in visible.split(",") if d.strip())
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return ()
    try:
        listing = subprocess.run(
            [nvidia_smi, "-L"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU "))


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range where it can: one in that range
    can be taken between two attempts by any outgoing connection, the next attempt's own
    ranks retrying their connect to it included (a TCP connect to a local port nothing
    listens on can connect to itself), and its rank 0 then cannot listen there."""
    ephemeral = _ephemeral_low()
    if ephemeral > LOWEST_PORT:
        first = random.randrange(LOWEST_PORT, ephemeral)  # two runs at once rarely collide
        for port in itertools.chain(range(first, ephemeral), range(LOWEST_PORT, first)):
            with socket.socket() as sock:
                try:
                    sock.bind((LOCALHOST, port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # not Linux: the kernel's choice, as before


# The trainer's directories a local run keeps under one folder of this machine (`state_dir`):
# it mounts none of the template's volumes (a claim, a hostPath, the emptyDir the cluster gives
# a directory no volume holds), and `/data` is rarely writable here.
LOCAL_DIR_OPTIONS = ("dataDir", "checkpointDir", "logDir")


def local_state_dir(job: DDPTrainingJob, env: Mapping[str, str]) -> Path:
    """Where a local run of `job` keeps its absolute directories: kept between runs, so a
    dataset is downloaded once and a stopped run resumes from its checkpoint."""
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "kube-ddp" / "local" / job.namespace / job.name


def fit_job(
    job: DDPTrainingJob, overrides: Overrides, machine: Machine, state_dir: Path | None = None
) -> DDPTrainingJob:
    """The job as it runs here: overrides applied and validated, on a free rendezvous port,
    its absolute trainer directories under `state_dir` (where given), or a LocalRunError
    saying why it cannot run and what to pass instead."""
    spec = job.spec
    if spec.launcher == "mpi":
        raise LocalRunError(
            "launcher: mpi cannot run locally (mpirun reaches the workers over ssh, through "
            "the MPI Operator): use launcher: torchrun for a local run"
        )
    if spec.run_policy.suspend:
        raise LocalRunError("runPolicy.suspend is true, so nothing would run: set it to false")
    document = job.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"status"})
    changed = document["spec"]
    if overrides.cpu:
        changed["accelerator"] = {"type": "cpu"}
        if changed.get("backend") in ("nccl", "hccl"):
            del changed["backend"]
    if overrides.nodes is not None:
        changed["nodes"] = overrides.nodes
    if overrides.nproc_per_node is not None:
        changed["nprocPerNode"] = overrides.nproc_per_node
        if changed.get("accelerator", {}).get("type", "cpu") != "cpu":
            changed["accelerator"]["perNode"] = overrides.nproc_per_node
    changed["port"] = free_port()
    # Its Secret is the cluster's: here the workers take the AWS variables of this shell.
    changed.pop("checkpointStore", None)
    trainer = changed.get("trainer") or {}
    for option in LOCAL_DIR_OPTIONS:
        path = trainer.get(option)
        if state_dir is not None and isinstance(path, str) and path.startswith("/"):
            trainer[option] = str(state_dir / path.lstrip("/"))
    try:
        fitted = load_job(document)
    except ValidationError as error:
        raise LocalRunError(
            "\n".join(f"with the command-line overrides: {line}" for line in describe_errors(error))
        ) from None
    _check_devices(fitted, machine)
    return fitted


def _check_devices(job: DDPTrainingJob, machine: Machine) -> None:
    accelerator = job.spec.accelerator
    if accelerator.type in ("gaudi", "amd"):
        raise LocalRunError(
            f"accelerator {accelerator.type} cannot run locally (kube-ddp run --local runs "
            "cpu jobs, and nvidia jobs on CUDA): pass --cpu to run this job on the CPU"
        )
    if accelerator.type != "nvidia":
        return
    wanted = job.spec.nodes * (accelerator.per_node or 1)
    have = len(machine.gpus)
    if wanted > have:
        fit = f"--nodes 1 --nproc-per-node {have}, or " if have else ""
        raise LocalRunError(
            f"the job asks for {job.spec.nodes} workers x {accelerator.per_node} nvidia.com/gpu "
            f"= {wanted} GPUs and this machine has {have}: pass {fit}--cpu"
        )


@dataclass(frozen=True)
class WorkerLaunch:
    """One worker pod as a local process: what to run, with which environment."""

    pod: str
    index: int
    attempt: int
    argv: list[str]
    env: dict[str, str]  # the process's whole environment
    pod_env: dict[str, str]  # the part the pod spec defines (the env contract and spec.env)
    owner_uid: str | None = None  # the job's, as the pod's controlling owner says
    cwd: Path | None = None  # where it runs (None: where kube-ddp runs)


@dataclass(frozen=True)
class LocalSettings:
    """The runner's side of every launch."""

    machine: Machine
    api_server: str  # where the trainer reports progress
    token_file: Path
    workdir: Path | None = None  # the workers' directory (None: where kube-ddp runs)


def worker_launches(
    job: DDPTrainingJob,
    attempt: int,
    indices: tuple[int, ...],
    local: LocalSettings,
    pod_names: tuple[str, ...] = (),
) -> list[WorkerLaunch]:
    """The worker pods the operator would create for `attempt`, as local processes."""
    pods = [
        obj
        for obj in build_children(job, attempt, BuildSettings(), indices, pod_names)
        if obj["kind"] == "Pod"
    ]
    return [_launch(job, pod, local) for pod in pods]


def _launch(job: DDPTrainingJob, pod: dict[str, Any], local: LocalSettings) -> WorkerLaunch:
    labels = pod["metadata"]["labels"]
    index = int(labels[names.LABEL_REPLICA_INDEX])
    container = _with_local_hosts(job, pod["spec"]["containers"][0])
    pod_env = resolve_env(container.get("env", []), _pod_fields(pod))
    argv = container_argv(container, pod_env)
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in FOREIGN_ENV and not name.startswith(FOREIGN_ENV_PREFIXES)
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(pod_env)
    env.update(_local_extras(job, index, pod_env, local))
    return WorkerLaunch(
        pod=pod["metadata"]["name"],
        index=index,
        attempt=int(labels[names.LABEL_ATTEMPT]),
        argv=argv,
        env=env,
        pod_env=pod_env,
        owner_uid=job.metadata.uid,
        cwd=local.workdir,
    )


def _local_extras(
    job: DDPTrainingJob, index: int, pod_env: Mapping[str, str], local: LocalSettings
) -> dict[str, str]:
    """What a cluster gives a pod outside its spec: its devices, a CPU share, the API."""
    spec = job.spec
    devices: list[str] = []
    if spec.accelerator.type == "nvidia":
        per_node = spec.accelerator.per_node or 1
        devices = list(local.machine.gpus[index * per_node : (index + 1) * per_node])
    extras = {
        contract.VISIBLE_GPUS_ENV: ",".join(devices),  # empty: a cpu pod sees no GPU
        contract.API_SERVER_ENV: local.api_server,
        contract.TOKEN_FILE_ENV: str(local.token_file),
        contract.UNBUFFERED_ENV: "1",
    }
    if contract.CPU_THREADS_ENV not in pod_env:
        # Pods get their CPU share from their limits; here all workers share this machine.
        extras[contract.CPU_THREADS_ENV] = str(max(1, local.machine.cpus // spec.world_size))
    return extras


def _with_local_hosts(job: DDPTrainingJob, container: dict[str, Any]) -> dict[str, Any]:
    """The container with the workers' DNS names (the headless Service's) as 127.0.0.1."""
    hosts = []
    for index in range(job.spec.nodes):
        service_name = f"{names.worker_name(job.name, index)}.{job.name}.{job.namespace}.svc"
        hosts += [f"{service_name}.cluster.local", service_name]
    hosts.sort(key=len, reverse=True)

    def local(text: str) -> str:
        for host in hosts:
            text = text.replace(host, LOCALHOST)
        return text

    env = [
        {**variable, "value": local(variable["value"])} if "value" in variable else variable
        for variable in container.get("env", [])
    ]
    return {
        **container,
        "env": env,
        "command": [local(word) for word in container.get("command", [])],
        "args": [local(word) for word in container.get("args", [])],
    }


_FIELD_IN_MAP = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def _pod_fields(pod: dict[str, Any]) -> Any:
    """A `valueFrom` resolver for the fields a local process has: the pod's own metadata,
    its node (this machine) and its IPs (127.0.0.1). Secrets and ConfigMaps are the cluster's."""
    metadata = pod["metadata"]
    known = {
        "metadata.name": metadata["name"],
        "metadata.namespace": metadata["namespace"],
        "spec.nodeName": socket.gethostname(),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": LOCALHOST,
        "status.podIPs": LOCALHOST,
        "status.hostIP": LOCALHOST,
        "status.hostIPs": LOCALHOST,
    }

    def value_from(name: str, source: Mapping[str, Any]) -> str:
        path = str((source.get("fieldRef") or {}).get("fieldPath", ""))
        if path in known:
            return str(known[path])
        in_map = _FIELD_IN_MAP.fullmatch(path)
        if in_map:
            return str(metadata.get(in_map.group(1), {}).get(in_map.group(2), ""))
        raise LocalRunError(
            f"spec.env {name}: valueFrom {json.dumps(dict(source))} has no value on this "
            "machine (a local run resolves fieldRef to the pod's name, namespace, labels, "
            "annotations, node and IPs): give it a value for the local run"
        )

    return value_from
