"""Pure builders: a DDPTrainingJob in, the Kubernetes objects the operator creates out.

No I/O and no owner references (the caller adopts the children). `kube-ddp render` prints
exactly what `build_children` returns.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from ddp_trainer import contract
from ddp_trainer.options import TrainerOptions, to_argv
from kube_ddp import gang, kueue, names
from kube_ddp.api import (
    DDPTrainingJob,
    DDPTrainingJobSpec,
    MPIOptions,
    Obj,
    starts_a_launcher,
)

SHM_VOLUME = "dshm"
# Intel Gaudi needs host IPC, huge pages and SYS_NICE (Habana's own job examples).
# What Intel's own Gaudi jobs ask for (docs.habana.ai, "Running Workloads on Kubernetes": 8 or
# 1 card(s), memory 409Gi, hugepages-2Mi 95000Mi; the Voyager reference jobs likewise). Habana's
# EKS guide asks 42000Mi and says such figures "could be adapted by your task and model": a job
# sets its own in resources, which this only fills in.
GAUDI_HUGEPAGES = "95000Mi"
GAUDI_MEMORY_REQUEST = "32Gi"  # huge pages are only accepted next to a cpu or memory request
# What the `restricted` Pod Security Standard asks of a pod and of each of its containers
# (kube_ddp.podsecurity): every pod gets these, the template's own settings merged over them.
RESTRICTED_POD_CONTEXT: Obj = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER_CONTEXT: Obj = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


@dataclass(frozen=True)
class BuildSettings:
    """What the operator's configuration adds to every job."""

    trainer_image: str = names.DEFAULT_TRAINER_IMAGE
    network_policy: bool = True  # a job's NetworkPolicy, unless its spec says otherwise


# --- names and labels -------------------------------------------------------------------------


def job_labels(job: DDPTrainingJob) -> dict[str, str]:
    """Labels every child carries; the operator selects its pods by them."""
    return {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_JOB_NAME: job.name}


def worker_labels(job: DDPTrainingJob, index: int, attempt: int) -> dict[str, str]:
    return {
        **job_labels(job),
        names.LABEL_REPLICA_INDEX: str(index),
        names.LABEL_ATTEMPT: str(attempt),
    }


def _metadata(job: DDPTrainingJob, name: str, labels: dict[str, str]) -> Obj:
    return {"name": name, "namespace": job.namespace, "labels": labels}


# --- the env contract -------------------------------------------------------------------------


def _nnodes(spec: DDPTrainingJobSpec) -> str:
    if spec.elastic is not None:
        return f"{spec.elastic.min_nodes}:{spec.elastic.max_nodes}"
    return str(spec.nodes)


def _runs_one_process_directly(spec: DDPTrainingJobSpec) -> bool:
    """One process per pod and no torchrun: the pod itself is the rank. Never where the ranks
    restart in place: the agent (torchrun) that restarts them runs in every pod."""
    return spec.procs_per_node == 1 and spec.elastic is None and not spec.restarts_in_place


def contract_env(job: DDPTrainingJob, index: int | None, attempt: int) -> list[Obj]:
    """The env contract (docs/design.md); `index` is None for MPI workers (ranks come from
    mpirun)."""
    spec = job.spec
    values: dict[str, str] = {}
    if index is not None:
        values[contract.MASTER_ADDR] = names.master_addr(job.name, job.namespace)
    values[contract.MASTER_PORT] = str(spec.rendezvous_port(attempt))
    values[contract.NNODES] = _nnodes(spec)
    if index is not None:
        values[contract.NODE_RANK] = str(index)
    values[contract.NPROC_PER_NODE] = str(spec.procs_per_node)
    values[contract.LOCAL_WORLD_SIZE] = str(spec.procs_per_node)
    values[contract.WORLD_SIZE] = str(spec.world_size)
    if index is not None and _runs_one_process_directly(spec):
        values |= {contract.RANK: str(index), contract.LOCAL_RANK: "0"}
    values |= {
        contract.DDP_BACKEND: spec.effective_backend,
        contract.JOB_NAME: job.name,
        contract.JOB_NAMESPACE: job.namespace,
        contract.ATTEMPT: str(attempt),
    }
    if spec.restarts_in_place:  # the agent applies the failure rules to its own ranks
        policy = spec.run_policy
        values[contract.RESTART_POLICY_ENV] = policy.restart_policy
        values[contract.RETRYABLE_EXIT_CODES_ENV] = ",".join(map(str, policy.retryable_exit_codes))
    result: list[Obj] = []
    for name, value in values.items():
        result.append({"name": name, "value": value})
        if (
            name in contract.TORCHRUN_MIRRORED
        ):  # torchrun reads each of its flags from PET_<FLAG> too
            result.append({"name": contract.torchrun_name(name), "value": value})
    for name, field_path in contract.FIELD_OF.items():
        result.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
    return result


# NCCL's watchdog, so that a hung collective or a lost peer ends the process in a bounded time
# and leaves a trace of where each rank was (docs/design.md, "Hangs and lost peers"). Each was
# read in the pinned torch 2.15 (ProcessGroupNCCL.hpp, FlightRecorder.hpp); set although some
# are 2.15's defaults, because images of their own carry older torch where they were not.
NCCL_WATCHDOG_ENV: Final = {
    # A timeout or NCCL error ends the process without ncclCommAbort, which can itself hang on
    # a dead peer (SkipCleanUp); torchrun would set 1 (TearDown) for its ranks.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    # The heartbeat monitor ends the process when the watchdog itself is stuck in a CUDA or
    # NCCL call (after TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC, 480 s).
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    # The flight recorder: the last 2000 collectives of each rank (2.15's default for NCCL;
    # off in torch before 2.4 and for torchcomms backends, whose default is 0).
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    # ... written to TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank> when a collective times out.
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
FLIGHT_RECORDER_DIR = "flight-recorder"  # under the trainer's checkpointDir


def flight_recorder_prefix(checkpoint_dir: str, attempt: int) -> str:
    """Where ranks write their flight-recorder dumps (torch adds the rank): beside the
    checkpoints, which outlive the attempt's pods, one name per attempt."""
    return f"{checkpoint_dir.rstrip('/')}/{FLIGHT_RECORDER_DIR}/attempt-{attempt}-rank-"


# Open MPI 4.1's orted shares its hwloc topology through shared memory mapped at a fixed
# address; with Debian's 4.1.4 one orted start in ten segfaults there (hwloc_shmem_topology_write,
# measured on the dev machine). Without it each rank reads the topology itself. mpirun passes
# its OMPI_MCA_ variables on to every orted; Open MPI 5 has no such parameter and ignores it.
OPEN_MPI_ENV = {"OMPI_MCA_rtc_hwloc_vmhole": "none"}


def _launcher_defaults(job: DDPTrainingJob, attempt: int) -> dict[str, str]:
    """Settings the launcher and torch.distributed need that the user may still override."""
    spec = job.spec
    defaults: dict[str, str] = {}
    if spec.elastic is not None or spec.restarts_in_place:
        # Also for a torchrun of the job's own command (torch.distributed.run), which
        # does not set it itself: contract.OWN_WORKER_STORE_ENV says why.
        defaults[contract.OWN_WORKER_STORE_ENV] = "1"
    if spec.effective_backend == "nccl":
        defaults |= NCCL_WATCHDOG_ENV
    if spec.launcher == "mpi":
        defaults |= OPEN_MPI_ENV
    checkpoint_dir = spec.trainer.checkpoint_dir if spec.trainer is not None else None
    if checkpoint_dir is not None and checkpoint_dir.startswith("/"):
        defaults[contract.FLIGHT_RECORDER_FILE] = flight_recorder_prefix(checkpoint_dir, attempt)
    return defaults


def checkpoint_store_env(spec: DDPTrainingJobSpec) -> list[Obj]:
    """The AWS variables from the Secret `checkpointStore.secretName` names: a Secret without
    a required key keeps the container from starting (the kubelet says which key), one without
    an optional key leaves its variable unset."""
    if spec.checkpoint_store is None:
        return []
    secret = spec.checkpoint_store.secret_name
    required = [(key, False) for key in contract.S3_SECRET_KEYS]
    optional = [(key, True) for key in contract.S3_OPTIONAL_SECRET_KEYS]
    return [
        {
            "name": key,
            "valueFrom": {
                "secretKeyRef": {"name": secret, "key": key, **({"optional": True} if may else {})}
            },
        }
        for key, may in required + optional
    ]


def worker_env(job: DDPTrainingJob, index: int | None, attempt: int) -> list[Obj]:
    """The contract first, then the user's env (which may refer to it as $(NAME)); a default
    or a checkpoint store's variable that the user's env also sets is left to the user's."""
    user = [e.model_dump(by_alias=True, exclude_none=True) for e in job.spec.env]
    chosen = {e["name"] for e in user}
    defaults = [
        {"name": name, "value": value}
        for name, value in _launcher_defaults(job, attempt).items()
        if name not in chosen
    ]
    store = [e for e in checkpoint_store_env(job.spec) if e["name"] not in chosen]
    return contract_env(job, index, attempt) + defaults + store + user


# --- what runs --------------------------------------------------------------------------------


def trainer_args(job: DDPTrainingJob) -> list[str]:
    return to_argv(job.spec.trainer) if job.spec.trainer is not None else []


def _torchrun(job: DDPTrainingJob, index: int) -> list[str]:
    """torchrun and its flags: worker `index`'s node of the job's rendezvous. Where the image
    holds the trainer package, its torchrun, which exits as the failed rank did (a rank killed
    by a signal restarts the group, a program error fails it); plain torchrun exits 1 for both.
    Where the ranks restart in place, a c10d rendezvous whose store worker 0's agent hosts
    (`is_host`, not left to torchrun's hostname matching), and as many restarts in place as
    the job has left (a bound: the operator counts them against backoffLimit)."""
    spec = job.spec
    launcher = list(contract.TORCHRUN_COMMAND) if spec.holds_the_trainer else ["torchrun"]
    command = [*launcher, f"--nnodes={_nnodes(spec)}", f"--nproc-per-node={spec.procs_per_node}"]
    rendezvous = [
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=$({contract.MASTER_ADDR}):$({contract.MASTER_PORT})",
        f"--rdzv-id={job.name}",
    ]
    if spec.restarts_in_place:
        return [
            *command,
            *rendezvous,
            f"--rdzv-conf=is_host={'true' if index == 0 else 'false'}",
            f"--max-restarts={restarts_left(job)}",
        ]
    if spec.elastic is not None:
        return [*command, *rendezvous, f"--max-restarts={spec.elastic.max_restarts}"]
    return [
        *command,
        f"--node-rank=$({contract.NODE_RANK})",
        f"--master-addr=$({contract.MASTER_ADDR})",
        f"--master-port=$({contract.MASTER_PORT})",
    ]


def restarts_left(job: DDPTrainingJob) -> int:
    """Restarts backoffLimit still allows: what a pod's agent may restart in place."""
    restarts = job.status.restarts if job.status is not None else 0
    return max(job.spec.run_policy.backoff_limit - restarts, 0)


def torchrun_command(job: DDPTrainingJob, index: int) -> list[str]:
    """torchrun in front of the trainer module (or plain python for one process per pod)."""
    if _runs_one_process_directly(job.spec):
        return list(contract.TRAINER_COMMAND)
    return [*_torchrun(job, index), "-m", contract.TRAINER_MODULE]


def user_command(job: DDPTrainingJob, index: int) -> list[str]:
    """The job's own program, which runs as written with one process per pod (the env carries
    RANK and LOCAL_RANK) or when it starts its own launcher; otherwise torchrun starts
    nprocPerNode copies of it (`--no-python`: the command is run as given), as Kubeflow
    Trainer's torch runtime does."""
    command = list(job.spec.command or [])
    if _runs_one_process_directly(job.spec) or starts_a_launcher(command):
        return command
    return [*_torchrun(job, index), "--no-python", *command]


def container_resources(spec: DDPTrainingJobSpec) -> Obj:
    """The user's resources plus the accelerator's devices (requests equal limits for those)."""
    limits: dict[str, Any] = dict(spec.resources.limits)
    requests: dict[str, Any] = dict(spec.resources.requests)
    device = spec.accelerator.resource
    if device is not None and spec.accelerator.per_node is not None:
        limits[device] = requests[device] = spec.accelerator.per_node
    if spec.accelerator.type == "gaudi":
        limits.setdefault("hugepages-2Mi", GAUDI_HUGEPAGES)
        requests.setdefault("hugepages-2Mi", limits["hugepages-2Mi"])
        if not {"cpu", "memory"} & (set(limits) | set(requests)):
            requests["memory"] = GAUDI_MEMORY_REQUEST
    resources: Obj = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return resources


def trainer_image_variant(spec: DDPTrainingJobSpec) -> str:
    """Which of a release's trainer images a job without its own runs: the MPI one for
    launcher: mpi, the CPU one (multi-arch, no CUDA) for CPU jobs, the CUDA one else. No
    release carries Intel's or AMD's torch: a Gaudi or AMD job names its own image."""
    if spec.launcher == "mpi":
        return "mpi"
    return "cpu" if spec.accelerator.type == "cpu" else "cuda"


def trainer_image(spec: DDPTrainingJobSpec, settings: BuildSettings) -> str:
    """The job's image, else the operator's trainer image of the job's variant: its tag with
    the variant's suffix, as a release tags them (an image pinned by digest is taken whole)."""
    if spec.image:
        return spec.image
    if "@" in settings.trainer_image:
        return settings.trainer_image
    return settings.trainer_image + names.TRAINER_IMAGE_SUFFIXES[trainer_image_variant(spec)]


def image_fields(spec: DDPTrainingJobSpec, settings: BuildSettings) -> Obj:
    """The container's image (the job's, else the operator's trainer image) and pull policy."""
    fields: Obj = {"image": trainer_image(spec, settings)}
    if spec.image_pull_policy:
        fields["imagePullPolicy"] = spec.image_pull_policy
    return fields


def _mounts_shm(spec: DDPTrainingJobSpec) -> bool:
    return any(m.get("mountPath") == "/dev/shm" for m in spec.template.volume_mounts)


# The trainer's directories that get an emptyDir when no volume holds them, by volume name.
WRITABLE_DIRS = {"ddp-data": "data_dir", "ddp-checkpoints": "checkpoint_dir"}


def _under(path: str, mount: str) -> bool:
    mount = mount.rstrip("/") or "/"
    return path == mount or path.startswith(mount if mount == "/" else mount + "/")


def writable_dirs(spec: DDPTrainingJobSpec) -> dict[str, str]:
    """The built-in trainer's absolute dataDir and checkpointDir that no volume of the
    template holds, by the name of the emptyDir they get: the image's user (uid 10001) can
    write nowhere else outside its home. Relative paths are under the image's home."""
    if spec.command is not None:
        return {}
    options = spec.trainer or TrainerOptions()
    mounted = [m.get("mountPath", "") for m in spec.template.volume_mounts]
    found: dict[str, str] = {}
    for volume, option in WRITABLE_DIRS.items():
        path = getattr(options, option)
        if not path or not path.startswith("/"):
            continue
        if not any(_under(path, m) for m in [*mounted, *found.values()]):
            found[volume] = path
    return found


def pod_security_context(spec: DDPTrainingJobSpec) -> Obj:
    """The template's security context over the restricted defaults, with fsGroup defaulting
    to the trainer image's group (and ownership changed only when a volume's root does not
    match it yet). Not with launcher mpi: an fsGroup makes the MPI Operator's ssh key Secret
    group-readable, and ssh and sshd refuse a private key others can read. A template that
    runs a container as root (runAsUser 0) does not get runAsNonRoot, which would stop it."""
    own = dict(spec.template.security_context or {})
    context = {**RESTRICTED_POD_CONTEXT, **own}
    if _runs_as_root(spec) and "runAsNonRoot" not in own:
        del context["runAsNonRoot"]
    if "fsGroup" not in context and spec.launcher != "mpi":
        context["fsGroup"] = names.TRAINER_IMAGE_GID
        context.setdefault("fsGroupChangePolicy", "OnRootMismatch")
    return context


def _runs_as_root(spec: DDPTrainingJobSpec) -> bool:
    template = spec.template
    contexts = [
        template.security_context or {},
        template.container.security_context or {},
        *(c.get("securityContext") or {} for c in template.init_containers),
    ]
    return any(c.get("runAsUser") == 0 for c in contexts)


def container_security_context(own: Obj | None) -> Obj:
    """A container's securityContext: its own over the restricted defaults (capabilities
    key by key, so that adding one keeps drop: [ALL])."""
    own = dict(own or {})
    capabilities = {
        **RESTRICTED_CONTAINER_CONTEXT["capabilities"],
        **(own.get("capabilities") or {}),
    }
    return {**RESTRICTED_CONTAINER_CONTEXT, **own, "capabilities": capabilities}


def _container(
    job: DDPTrainingJob,
    *,
    name: str,
    command: list[str],
    args: list[str],
    env: list[Obj],
    settings: BuildSettings,
    attempt: int,
) -> Obj:
    """The worker container: what it runs, image, resources, mounts and accelerator extras."""
    spec = job.spec
    container: Obj = {
        "name": name,
        **image_fields(spec, settings),
        "command": command,
        **({"args": args} if args else {}),
        "env": env,
        "resources": container_resources(spec),
        "ports": [
            {"name": "ddp", "containerPort": spec.rendezvous_port(attempt), "protocol": "TCP"}
        ],
        # A failed worker's last log lines become its terminated state's message, which the
        # operator copies into status.failure and the job's Event.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    mounts = list(spec.template.volume_mounts)
    mounts += [{"name": v, "mountPath": path} for v, path in writable_dirs(spec).items()]
    if not _mounts_shm(spec):
        # DataLoader workers and NCCL/HCCL share tensors through /dev/shm; 64Mi is too small.
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    container["volumeMounts"] = mounts
    container.update(container_settings(spec, worker=True))
    return container


def container_settings(spec: DDPTrainingJobSpec, *, worker: bool) -> Obj:
    """template.container's fields and, in a worker, the accelerator's capability merged into
    its securityContext (the MPI launcher takes no probes or hooks, and runs no accelerator
    code: it keeps the restricted capabilities)."""
    settings = spec.template.container
    fields: Obj = {
        "envFrom": settings.env_from or None,
        "workingDir": settings.working_dir,
        "securityContext": container_security_context(settings.security_context),
    }
    if worker:
        fields |= {
            "lifecycle": settings.lifecycle,
            "livenessProbe": settings.liveness_probe,
            "readinessProbe": settings.readiness_probe,
            "startupProbe": settings.startup_probe,
        }
    if worker and spec.accelerator.type == "gaudi":
        context = fields["securityContext"]
        capabilities = dict(context.get("capabilities") or {})
        added = list(capabilities.get("add") or [])
        capabilities["add"] = added if "SYS_NICE" in added else [*added, "SYS_NICE"]
        fields["securityContext"] = {**context, "capabilities": capabilities}
    return {key: value for key, value in fields.items() if value is not None}


# Kubernetes' own terminationGracePeriodSeconds, when a pod says none.
DEFAULT_GRACE_SECONDS = 30
# A SIGTERM's save takes about what the last measured one took; twice that allows for a slower
# disk or store, and the margin for the ranks to finish their step and agree on it, and exit.
SAVE_GRACE_FACTOR = 2
SAVE_GRACE_MARGIN_SECONDS = 15


def termination_grace_seconds(job: DDPTrainingJob) -> int | None:
    """The workers' grace period: enough for the checkpoint a SIGTERM saves, by the job's last
    measured save (status.training.checkpoint.saveSeconds), never less than the template's
    own (or Kubernetes' 30 s): max(that, 2 x save + 15). None: no save measured and none set,
    so each pod keeps Kubernetes' default."""
    own = job.spec.template.termination_grace_period_seconds
    training = job.status.training if job.status else None
    checkpoint = training.checkpoint if training else None
    if checkpoint is None or checkpoint.save_seconds is None:
        return own
    fits = math.ceil(SAVE_GRACE_FACTOR * checkpoint.save_seconds) + SAVE_GRACE_MARGIN_SECONDS
    return max(DEFAULT_GRACE_SECONDS if own is None else own, fits)


def avoiding(affinity: Obj | None, nodes: Sequence[str]) -> Obj:
    """`affinity` (the template's, unchanged) with a preference, the strongest a term can have,
    for nodes other than `nodes`: a soft one, so a group is never kept off the only nodes that
    fit. By the node's name (`matchFields`): a hostname label may differ from it."""
    avoid = {
        "weight": 100,
        "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}]
        },
    }
    own = dict(affinity or {})
    node_affinity = dict(own.get("nodeAffinity") or {})
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [*preferred, avoid]
    return {**own, "nodeAffinity": node_affinity}


def node_lost_tolerations(job: DDPTrainingJob) -> list[Obj]:
    """NoExecute tolerations of a node that stopped reporting, for
    `runPolicy.unreachableTolerationSeconds`: without them a pod gets the API server's default
    (300 s), minutes of a group idle. A taint the template tolerates already is left to it."""
    seconds = job.spec.run_policy.unreachable_toleration_seconds
    return [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for key in names.NODE_LOST_TAINTS
        if not any(_tolerates(own, key) for own in job.spec.template.tolerations)
    ]


def _tolerates(toleration: Obj, key: str) -> bool:
    """`toleration` covers the NoExecute taint `key` (an empty key with Exists covers all)."""
    if toleration.get("effect") not in (None, "", "NoExecute"):
        return False
    own = toleration.get("key")
    return own == key or (not own and toleration.get("operator") == "Exists")


def _pod_spec(job: DDPTrainingJob, containers: list[Obj]) -> Obj:
    """Pod-level settings shared by torchrun workers and MPI workers, template merged in."""
    spec = job.spec
    template = spec.template
    volumes = list(template.volumes)
    volumes += [{"name": v, "emptyDir": {}} for v in writable_dirs(spec)]
    if not _mounts_shm(spec):
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    tolerations = list(template.tolerations)
    device = spec.accelerator.resource
    if device is not None:
        # Clusters commonly taint accelerator nodes with the device's resource name.
        tolerations.append({"key": device, "operator": "Exists", "effect": "NoSchedule"})
    pod: Obj = {
        "restartPolicy": "Never",  # restarts are the operator's: the whole group at once
        "enableServiceLinks": False,
        "containers": containers,
        "volumes": volumes,
    }
    if tolerations:
        pod["tolerations"] = tolerations
    if spec.accelerator.type == "gaudi":
        pod["hostIPC"] = True
    optional = {
        "imagePullSecrets": template.image_pull_secrets or None,
        "initContainers": [
            {**c, "securityContext": container_security_context(c.get("securityContext"))}
            for c in template.init_containers
        ]
        or None,
        "nodeSelector": template.node_selector or None,
        "affinity": template.affinity,
        "priorityClassName": template.priority_class_name,
        "schedulerName": template.scheduler_name,
        # The user's account wins; the reporter's RoleBinding names it too.
        "serviceAccountName": template.service_account_name or reporter_account(job),
        "securityContext": pod_security_context(spec),
        "topologySpreadConstraints": template.topology_spread_constraints or None,
        "runtimeClassName": template.runtime_class_name,
        "terminationGracePeriodSeconds": termination_grace_seconds(job),
        "dnsConfig": template.dns_config,
        "hostAliases": template.host_aliases or None,
    }
    pod.update({key: value for key, value in optional.items() if value is not None})
    return pod


def _pod_metadata(job: DDPTrainingJob, name: str | None, labels: dict[str, str]) -> Obj:
    metadata: Obj = {"labels": {**job.spec.template.labels, **labels}}
    if name is not None:
        metadata = {"name": name, "namespace": job.namespace, **metadata}
    if job.spec.template.annotations:
        metadata["annotations"] = dict(job.spec.template.annotations)
    return metadata


# --- the children -----------------------------------------------------------------------------


def reporter_account(job: DDPTrainingJob) -> str:
    """The ServiceAccount the workers run as, so the trainer can report its progress."""
    return f"{job.name}-trainer"


def build_reporter_rbac(job: DDPTrainingJob) -> list[Obj]:
    """ServiceAccount, Role and RoleBinding that allow exactly one thing: get and patch this
    job's status (the trainer's rank 0 writes status.training through them). The binding
    names the job's own account and, when the template names one, the user's account the
    workers then run as."""
    account = reporter_account(job)
    labels = job_labels(job)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(job, account, labels),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(job, account, labels),
            "rules": [
                {
                    "apiGroups": [names.GROUP],
                    "resources": [f"{names.PLURAL}/status"],
                    "resourceNames": [job.name],
                    "verbs": ["get", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(job, account, labels),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": account,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": name, "namespace": job.namespace}
                for name in dict.fromkeys([account, job.spec.template.service_account_name])
                if name
            ],
        },
    ]


def build_service(job: DDPTrainingJob) -> Obj:
    """The headless Service giving every worker a stable DNS name before it is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, job.name, job_labels(job)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": job_labels(job),
            "ports": [{"name": "ddp", "port": job.spec.port, "targetPort": job.spec.port}],
        },
    }


def build_worker_pod(
    job: DDPTrainingJob,
    index: int,
    attempt: int,
    settings: BuildSettings,
    name: str | None = None,
    avoid_nodes: Sequence[str] = (),
) -> Obj:
    """Worker `index` of attempt `attempt` (torchrun launcher), named `name` (a successor's,
    `names.successor_name`) or the worker's first name, preferring nodes other than
    `avoid_nodes`."""
    spec = job.spec
    if spec.command is not None:
        command, args = user_command(job, index), list(spec.args or [])
    else:
        command, args = torchrun_command(job, index), trainer_args(job)
    env = worker_env(job, index, attempt)
    container = _container(
        job,
        name=names.TRAINER_CONTAINER,
        command=command,
        args=args,
        env=env,
        settings=settings,
        attempt=attempt,
    )
    pod_spec = _pod_spec(job, [container])
    pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *node_lost_tolerations(job)]
    if avoid_nodes:
        pod_spec["affinity"] = avoiding(pod_spec.get("affinity"), avoid_nodes)
    pod_spec["hostname"] = names.worker_name(job.name, index)
    pod_spec["subdomain"] = job.name
    name = name or names.worker_name(job.name, index)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _pod_metadata(job, name, worker_labels(job, index, attempt)),
        "spec": pod_spec,
    }


def build_worker_pods(
    job: DDPTrainingJob,
    attempt: int,
    settings: BuildSettings,
    indices: Iterable[int] | None = None,
    pod_names: Sequence[str] = (),
    avoid_nodes: Sequence[str] = (),
) -> list[Obj]:
    chosen = list(range(job.spec.nodes) if indices is None else indices)
    named: Sequence[str | None] = pod_names or [None] * len(chosen)
    return [
        build_worker_pod(job, i, attempt, settings, name, avoid_nodes)
        for i, name in zip(chosen, named, strict=True)
    ]


# Passed on to every rank by mpirun: ranks started over ssh get sshd's environment, not the
# container's, so without these python is not found and rank 0 cannot reach the API server.
MPI_FORWARDED_ENV = ("PATH", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
SSHD_CONFIG = "/tmp/kube-ddp-sshd_config"
# How long the launcher waits for every worker's name to resolve before it gives up.
MPI_RESOLVE_WAIT_S: Final = 300


def _mpi(spec: DDPTrainingJobSpec) -> MPIOptions:
    return spec.mpi or MPIOptions()


# `$NAME` or `${NAME}` in an mpi.extraArgs word; `$$` is a literal `$`.
_ENV_REFERENCE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def launcher_shell_word(arg: str) -> str:
    """`arg` as one word of the launcher's bash line, its environment references expanded there
    (the seed's `--prefix $MPI_ROOT` names the image's variable, which only the launcher's shell
    knows) and nothing else: no command substitution, globbing or word splitting. A variable the
    launcher's environment lacks stops it with a line naming the variable."""
    parts, at = [], 0
    for match in _ENV_REFERENCE.finditer(arg):
        literal = arg[at : match.start()] + ("$" if match.group() == "$$" else "")
        if literal:
            parts.append(shlex.quote(literal))
        name = match.group(1) or match.group(2)
        if name:
            why = "not set in the launcher environment, and mpi.extraArgs names it"
            parts.append(f'"${{{name}?{why}}}"')
        at = match.end()
    if at < len(arg) or not parts:
        parts.append(shlex.quote(arg[at:]))
    return "".join(parts)


# Intel's Gaudi nodes (HLS): 2 sockets, and cores per socket over cards per socket, 6, bound to
# each process (Model-References' and the Voyager jobs' --map-by ppr:4:socket:PE=6).
GAUDI_SOCKETS_PER_NODE: Final = 2
GAUDI_CORES_PER_PROCESS: Final = 6


def mpirun_placement(spec: DDPTrainingJobSpec) -> list[str]:
    """How mpirun maps and binds the ranks: Gaudi's binding for Gaudi, the job's where it sets
    one, else none (Horovod's `-bind-to none -map-by slot`: torch and NCCL place their own
    threads, and a core bound to each rank would starve its intra-op pool)."""
    mpi = _mpi(spec)
    sockets, cores = mpi.sockets_per_node, mpi.cores_per_process
    if spec.accelerator.type == "gaudi":
        sockets = sockets or GAUDI_SOCKETS_PER_NODE
        cores = cores or GAUDI_CORES_PER_PROCESS
    if mpi.map_by is None and sockets is None and cores is None:
        return ["--bind-to", "none", "--map-by", "slot"]
    per_socket = math.ceil(spec.procs_per_node / (sockets or 1))
    map_by = mpi.map_by or f"ppr:{per_socket}:socket:PE={cores or 1}"
    return ["--bind-to", "core", "--map-by", map_by, "--rank-by", "core"]


def _sets_prefix(extra_args: Sequence[str]) -> bool:
    return any(arg in ("--prefix", "-prefix") or arg.startswith("--prefix=") for arg in extra_args)


def mpirun_command(job: DDPTrainingJob) -> list[str]:
    """The launcher's mpirun line; MASTER_ADDR is the first host of the MPI host file."""
    spec = job.spec
    mpi = _mpi(spec)
    program = (
        spec.command + (spec.args or [])
        if spec.command
        else [*contract.TRAINER_COMMAND, *trainer_args(job)]
    )
    exported = [
        contract.MASTER_ADDR,
        *MPI_FORWARDED_ENV,
        *(e["name"] for e in worker_env(job, None, 0)),
    ]
    # The workers' sshd listens on ssh_port and trusts the job's key (their start script).
    ssh = (
        f"-p {mpi.ssh_port} -i {mpi.ssh_auth_mount_path}/id_rsa -o ConnectionAttempts=10 "
        "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    )
    # Open MPI's --prefix sets PATH and LD_LIBRARY_PATH for the orted that ssh starts: images
    # whose Open MPI is outside the non-interactive PATH (Intel Gaudi's) set MPI_ROOT to it.
    prefix = [] if _sets_prefix(mpi.extra_args) else ['${MPI_ROOT:+--prefix "$MPI_ROOT"}']
    options = [
        "--allow-run-as-root",
        *("-np", str(spec.world_size)),
        *mpirun_placement(spec),
        *("--mca", "plm_rsh_args", ssh),
        *(arg for name in exported for arg in ("-x", name)),
    ]
    # MASTER_ADDR: the first host of the host file (`host slots=N`), in bash alone: images
    # need not carry awk. Then every host must resolve before mpirun: ssh gives up at once on a
    # name without a record, and a launcher can start before its workers' pods have addresses
    # (an MPIJob resumed from suspend creates both at once). `getent ahosts` asks getaddrinfo,
    # as ssh does: an address passes at once (`getent hosts` would want a name for it).
    script = (
        "set -eu; MASTER_ADDR=; hosts=; "
        "while read -r host _; do case $host in ''|'#'*) continue;; esac; "
        'host=${host%%:*}; MASTER_ADDR=${MASTER_ADDR:-$host}; hosts="$hosts $host"; '
        'done < "${OMPI_MCA_orte_default_hostfile:-/etc/mpi/hostfile}"; '
        "if command -v getent >/dev/null; then for host in $hosts; do tries=0; "
        'until getent ahosts "$host" >/dev/null; do tries=$((tries+1)); '
        f"if [ $tries -ge {MPI_RESOLVE_WAIT_S} ]; then "
        f'echo "kube-ddp: $host did not resolve in {MPI_RESOLVE_WAIT_S} s: is its worker pod '
        "created and the MPIJob's Service there?\" >&2; exit 1; fi; sleep 1; done; done; fi; "
        "export MASTER_ADDR; exec "
        + " ".join(
            [
                "mpirun",
                *prefix,
                shlex.join(options),
                *map(launcher_shell_word, mpi.extra_args),
                shlex.join(program),
            ]
        )
    )
    return ["/bin/bash", "-c", script]


def sshd_command(job: DDPTrainingJob) -> list[str]:
    """An MPI worker: sshd in the foreground on ssh_port, trusting the job's key, as whichever
    user the image runs (the MPI Operator mounts the key pair at ssh_auth_mount_path)."""
    mpi = _mpi(job.spec)
    keys = mpi.ssh_auth_mount_path
    config = "\n".join(
        [
            f"Port {mpi.ssh_port}",
            f"HostKey {keys}/id_rsa",
            f"AuthorizedKeysFile {keys}/authorized_keys",
            "PidFile /tmp/kube-ddp-sshd.pid",
            "StrictModes no",  # the Secret volume's files are root's, readable by all
            "UsePAM no",
            "PasswordAuthentication no",
        ]
    )
    script = (
        f"set -eu; printf '%s\\n' {shlex.quote(config)} > {SSHD_CONFIG}; "
        # root's sshd needs its privilege separation directory; others do not use it
        'if [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi; '
        f"exec /usr/sbin/sshd -D -e -f {SSHD_CONFIG}"
    )
    return ["/bin/sh", "-c", script]


# What the launcher asks for: mpirun and one ssh per worker. A request Kueue counts gives its pod
# set a flavor (where every flavor names a Topology, one that requests nothing is never
# admitted) and the scheduler something to reserve; no limit, so no mpirun is ever throttled
# or killed for its memory.
LAUNCHER_REQUESTS: Final = {"cpu": "100m", "memory": "128Mi"}


def mpi_pod_labels(job: DDPTrainingJob, attempt: int) -> dict[str, str]:
    """The launcher's and workers' labels: the job and attempt, but not `managed-by`, so the
    operator never takes the MPI Operator's pods for its own torchrun workers."""
    return {names.LABEL_JOB_NAME: job.name, names.LABEL_ATTEMPT: str(attempt)}


def _launcher_pod_spec(job: DDPTrainingJob, launcher: Obj) -> Obj:
    """The launcher runs only mpirun: the template's placement, security and volumes, but no
    accelerator, host IPC or /dev/shm, and no PersistentVolumeClaim (data and checkpoints stay
    with the workers; a ReadWriteOnce claim could not follow the launcher to another node)."""
    pod = _pod_spec(job, [launcher])
    del pod["restartPolicy"]  # the replica's restartPolicy is the MPIJob's field for it
    pod.pop("hostIPC", None)
    pod.pop("initContainers", None)  # they prepare the workers (and may mount their claims)
    device = job.spec.accelerator.resource
    pod["tolerations"] = [t for t in pod.get("tolerations", []) if t.get("key") != device]
    pod.update(launcher_placement(job))
    for key in ("nodeSelector", "tolerations"):
        if not pod.get(key, True):
            del pod[key]
    left_out = {SHM_VOLUME, *writable_dirs(job.spec)} | {
        v["name"] for v in job.spec.template.volumes if "persistentVolumeClaim" in v
    }
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in left_out]
    mounts = [m for m in job.spec.template.volume_mounts if m.get("name") not in left_out]
    if mounts:
        launcher["volumeMounts"] = mounts
    return pod


def _admitted_launcher(job: DDPTrainingJob) -> Obj:
    """The launcher's pod set as Kueue admitted it (an annotation `kueue.plan` writes on the
    job); empty when the job was not admitted through a queue, and the launcher goes where the
    template says."""
    kept = job.metadata.annotations.get(names.LAUNCHER_PLACEMENT_ANNOTATION)
    return json.loads(kept) if kept else {}


def launcher_placement(job: DDPTrainingJob) -> Obj:
    """The launcher's nodeSelector and tolerations as Kueue admitted its pod set."""
    placement = _admitted_launcher(job)
    return {key: placement[key] for key in ("nodeSelector", "tolerations") if key in placement}


def _launcher_metadata(job: DDPTrainingJob, labels: dict[str, str]) -> Obj:
    """The launcher's pod metadata, with the annotations of its admission (Kueue's mark of a
    pod set it placed by topology unasked)."""
    metadata = _pod_metadata(job, None, labels)
    admitted = _admitted_launcher(job).get("annotations") or {}
    if admitted:
        metadata["annotations"] = {**metadata.get("annotations", {}), **admitted}
    return metadata


def _mpi_templates(job: DDPTrainingJob, attempt: int, settings: BuildSettings) -> dict[str, Obj]:
    """The MPIJob's pod templates by the Workload's pod set: the launcher running mpirun, a
    worker running sshd."""
    spec = job.spec
    pod_labels = mpi_pod_labels(job, attempt)
    env = worker_env(job, None, attempt)
    worker = _container(
        job,
        name="worker",
        command=sshd_command(job),
        args=[],
        env=env,
        settings=settings,
        attempt=attempt,
    )
    launcher = {
        "name": "launcher",
        **image_fields(spec, settings),
        "command": mpirun_command(job),
        "env": env,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": dict(LAUNCHER_REQUESTS)},
        **container_settings(spec, worker=False),
    }
    worker_pod = _pod_spec(job, [worker])
    del worker_pod["restartPolicy"]  # the replica's restartPolicy is the MPIJob's field for it
    launcher_template = {
        "metadata": _launcher_metadata(job, pod_labels),
        "spec": _launcher_pod_spec(job, launcher),
    }
    worker_template = {"metadata": _pod_metadata(job, None, pod_labels), "spec": worker_pod}
    return {
        kueue.LAUNCHER_POD_SET: gang.join(job, launcher_template),
        kueue.POD_SET: gang.join(job, worker_template),
    }


# The MPIJob's replica of each of the Workload's pod sets.
MPI_REPLICAS: Final = {kueue.LAUNCHER_POD_SET: "Launcher", kueue.POD_SET: "Worker"}


def build_mpijob(job: DDPTrainingJob, attempt: int, settings: BuildSettings) -> Obj:
    """A Kubeflow MPIJob (v2beta1): a launcher running mpirun, one worker pod per node running
    sshd, each template as Kueue's topology ungater finds its pods where Kueue places them by
    topology. kube-ddp keeps the restart decisions (backoffLimit 0 here), the deadline and the
    TTL across attempts; suspend and cleanPodPolicy are the MPIJob's own (docs/mpi.md)."""
    spec = job.spec
    templates = _mpi_templates(job, attempt, settings)
    # A gang holds every pod until all can be placed, the launcher among them: it must be
    # created with the workers (ssh's ConnectionAttempts covers sshd's start).
    creation = "AtStartup" if gang.gang_of(job) is not None else "WaitForWorkersReady"
    replicas = {
        replica: {
            "replicas": spec.nodes if pod_set == kueue.POD_SET else 1,
            "restartPolicy": "Never",
            "template": kueue.placed_by_topology(job, pod_set, templates[pod_set]),
        }
        for pod_set, replica in MPI_REPLICAS.items()
    }
    return {
        "apiVersion": names.MPIJOB_API_VERSION,
        "kind": names.MPIJOB_KIND,
        "metadata": _metadata(
            job, job.name, {**job_labels(job), names.LABEL_ATTEMPT: str(attempt)}
        ),
        "spec": {
            "slotsPerWorker": spec.procs_per_node,
            "runPolicy": {
                "cleanPodPolicy": spec.run_policy.clean_pod_policy,
                "backoffLimit": 0,  # a failed launcher fails the MPIJob; kube-ddp decides
                "suspend": spec.run_policy.suspend,
            },
            "mpiImplementation": "OpenMPI",
            # Without a gang mpirun starts once every worker's sshd is up, not into retries.
            "launcherCreationPolicy": creation,
            "sshAuthMountPath": _mpi(spec).ssh_auth_mount_path,
            "mpiReplicaSpecs": replicas,
        },
    }


def mpijob_placement(mpijob: Obj) -> list[Obj]:
    """JSON patch operations that give an existing MPIJob the placement (nodeSelector,
    tolerations, scheduling gates and the pods' labels and annotations, by which Kueue's
    topology ungater finds them) of `mpijob`'s templates: a suspended MPIJob resumed under a
    new admission (the MPI Operator copies them into its suspended launcher Job when it
    resumes)."""
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    placement = []
    for replica in MPI_REPLICAS.values():
        template = replicas[replica]["template"]
        path = f"/spec/mpiReplicaSpecs/{replica}/template"
        placement.append({"op": "add", "path": f"{path}/metadata", "value": template["metadata"]})
        placement += [
            {"op": "add", "path": f"{path}/spec/{key}", "value": template["spec"].get(key, empty)}
            for key, empty in (("nodeSelector", {}), ("tolerations", []), ("schedulingGates", []))
        ]
    return placement


def kueue_pods(job: DDPTrainingJob, settings: BuildSettings) -> dict[str, Obj]:
    """The pods of each of the job's Kueue pod sets, by the pod set's name: the worker pod;
    with launcher mpi the MPIJob's launcher and worker templates (Kueue counts their
    requests; `kueue.build_workload` makes the pod sets)."""
    if job.spec.launcher == "mpi":
        return _mpi_templates(job, 0, settings)
    return {kueue.POD_SET: gang.join(job, build_worker_pod(job, 0, 0, settings))}


def mpi_admission_probes(mpijob: Obj) -> list[Obj]:
    """A pod of each of the MPIJob's replicas (the launcher, the first worker), as the MPI
    Operator will create them, for a server-side dry run before the MPIJob exists: the MPI
    Operator's own creates are refused where the job cannot see it (PodSecurity, a webhook,
    a LimitRange), so kube-ddp asks the API server first and says the answer on the job."""
    namespace = mpijob["metadata"]["namespace"]
    name = mpijob["metadata"]["name"]
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **replicas[replica]["template"]["metadata"],
                "name": f"{name}-{suffix}",
                "namespace": namespace,
            },
            "spec": replicas[replica]["template"]["spec"],
        }
        for replica, suffix in (("Launcher", "launcher"), ("Worker", "worker-0"))
    ]


def build_network_policy(job: DDPTrainingJob, settings: BuildSettings) -> Obj | None:
    """Ingress to the job's pods (workers; with launcher mpi, the launcher too) from the job's
    own pods only, on any port: the rendezvous and sshd take no password, and the collectives
    (NCCL, gloo, Open MPI) connect between peers on ports of their own choosing. Egress (DNS,
    the API server for the progress reports, datasets) is left alone. None when turned off."""
    own = job.spec.network_policy
    enabled = own.enabled if own is not None and own.enabled is not None else None
    if not (settings.network_policy if enabled is None else enabled):
        return None
    pods = {"matchLabels": {names.LABEL_JOB_NAME: job.name}}
    widened = own.ingress if own is not None else []
    return {
        "apiVersion": names.NETWORK_POLICY_API_VERSION,
        "kind": names.NETWORK_POLICY_KIND,
        "metadata": _metadata(job, job.name, job_labels(job)),
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": pods}]}, *widened],
        },
    }


def build_children(
    job: DDPTrainingJob,
    attempt: int = 0,
    settings: BuildSettings | None = None,
    indices: Iterable[int] | None = None,
    pod_names: Sequence[str] = (),
    avoid_nodes: Sequence[str] = (),
) -> list[Obj]:
    """Everything the operator creates for `job` at `attempt` (only the worker pods in
    `indices`, when given, under `pod_names` where given, preferring nodes other than
    `avoid_nodes`), in creation order: the
    NetworkPolicy before any pod, so none is open for a moment; pods last, since they name the
    ServiceAccount (and their PodGroup, which must exist before its pods are scheduled)."""
    settings = settings or BuildSettings()
    rbac = build_reporter_rbac(job)
    policy = build_network_policy(job, settings)
    guarded = [policy] if policy is not None else []
    pod_group = gang.build_pod_group(job, job_labels(job))
    grouped = [pod_group] if pod_group else []
    if job.spec.launcher == "mpi":
        return [*guarded, *rbac, *grouped, build_mpijob(job, attempt, settings)]
    pods = [
        kueue.placed_by_topology(job, kueue.POD_SET, gang.join(job, p))
        for p in build_worker_pods(job, attempt, settings, indices, pod_names, avoid_nodes)
    ]
    return [build_service(job), *guarded, *rbac, *grouped, *pods]


def build_event(
    job: Mapping[str, Any], type_: str, reason: str, message: str, now: datetime
) -> Obj:
    """A core/v1 Event about `job` (a job object as read from the API)."""
    metadata = job["metadata"]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
        "involvedObject": {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": names.MANAGED_BY},
        "reportingComponent": names.MANAGED_BY,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
