"""Pure builders: a DDPTrainingJob in, the Kubernetes objects the operator creates out.

No I/O and no owner references (the caller adopts the children). What both launchers share:
the env contract, containers and pod specs, RBAC, the NetworkPolicy, Events; each launcher's
own objects are in `kube_ddp.launchers`, whose `build_children` `kube-ddp render` prints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_trainer import contract
from ddp_trainer.options import TrainerOptions, to_argv
from kube_ddp import names
from kube_ddp.api import DDPTrainingJob, DDPTrainingJobSpec, Obj
from kube_ddp.own_command import starts_a_launcher

SHM_VOLUME = "dshm"
# The workers' ServiceAccount token, short-lived and rotated by the kubelet, with the cluster's
# CA: what Kubernetes' automount gives, mounted in the worker container only.
TOKEN_VOLUME = "kube-ddp-token"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3600
TOKEN_VOLUME_SOURCE: Obj = {
    "name": TOKEN_VOLUME,
    "projected": {
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                    ]
                }
            },
        ]
    },
}
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
    values[contract.NNODES] = spec.nnodes
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
        # empty: the pod's own API server, token and CA, whatever an envFrom source says
        **dict.fromkeys(contract.REPORTER_ENV, ""),
    }
    if not reports(job):
        values[contract.REPORT_ENV] = "false"
    if spec.restarts_in_place:  # the agent applies the failure rules to its own ranks
        policy = spec.run_policy
        values[contract.RESTART_POLICY_ENV] = policy.restart_policy
        values[contract.RETRYABLE_EXIT_CODES_ENV] = ",".join(map(str, policy.retryable_exit_codes))
    # torchrun reads each of its flags from PET_<FLAG> too, which a command that starts its own
    # torchrun relies on. Not the node's rank where kube-ddp's torchrun joins a c10d
    # rendezvous (which numbers the nodes itself): torchrun warns of a node rank given there.
    mirrored = set(contract.TORCHRUN_MIRRORED)
    if (spec.restarts_in_place or spec.elastic is not None) and not (
        spec.command and starts_a_launcher(list(spec.command))
    ):
        mirrored.discard(contract.NODE_RANK)
    result: list[Obj] = []
    for name, value in values.items():
        result.append({"name": name, "value": value})
        if name in mirrored:
            result.append({"name": contract.torchrun_name(name), "value": value})
    for name, field_path in contract.FIELD_OF.items():
        result.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
    return result


FLIGHT_RECORDER_DIR = "flight-recorder"  # under the trainer's checkpointDir


def flight_recorder_prefix(checkpoint_dir: str, attempt: int) -> str:
    """Where ranks write their flight-recorder dumps (torch adds the rank): beside the
    checkpoints, which outlive the attempt's pods, one name per attempt."""
    return f"{checkpoint_dir.rstrip('/')}/{FLIGHT_RECORDER_DIR}/attempt-{attempt}-rank-"


def _launcher_defaults(job: DDPTrainingJob, attempt: int, own: Mapping[str, str]) -> dict[str, str]:
    """Settings the launcher and torch.distributed need that the user may still override;
    `own` are the launcher's own (`launchers.mpi`'s for Open MPI)."""
    spec = job.spec
    defaults: dict[str, str] = {}
    if spec.elastic is not None or spec.restarts_in_place:
        # Also for a torchrun of the job's own command (torch.distributed.run), which
        # does not set it itself: contract.OWN_WORKER_STORE_ENV says why.
        defaults[contract.OWN_WORKER_STORE_ENV] = "1"
    if spec.effective_backend == "nccl":
        defaults |= contract.NCCL_WATCHDOG_ENV
    defaults |= own
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


def worker_env(
    job: DDPTrainingJob, index: int | None, attempt: int, launcher_env: Mapping[str, str] = {}
) -> list[Obj]:
    """The contract first, then the user's env (which may refer to it as $(NAME)); a default
    (`launcher_env` the launcher's own) or a checkpoint store's variable that the user's env
    also sets is left to the user's."""
    user = [e.model_dump(by_alias=True, exclude_none=True) for e in job.spec.env]
    chosen = {e["name"] for e in user}
    defaults = [
        {"name": name, "value": value}
        for name, value in _launcher_defaults(job, attempt, launcher_env).items()
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
    command = [*launcher, f"--nnodes={spec.nnodes}", f"--nproc-per-node={spec.procs_per_node}"]
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
    if spec.runs_as_root and "runAsNonRoot" not in own:
        del context["runAsNonRoot"]
    if "fsGroup" not in context and spec.launcher != "mpi":
        context["fsGroup"] = names.TRAINER_IMAGE_GID
        context.setdefault("fsGroupChangePolicy", "OnRootMismatch")
    return context


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
    # The token rank 0 reports with, at the path Kubernetes' own mount has: in this container
    # only (`_pod_spec` mounts no other).
    mounts.append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
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
    if any(m["name"] == TOKEN_VOLUME for c in containers for m in c.get("volumeMounts", [])):
        volumes.append(TOKEN_VOLUME_SOURCE)
    tolerations = list(template.tolerations)
    device = spec.accelerator.resource
    if device is not None:
        # Clusters commonly taint accelerator nodes with the device's resource name.
        tolerations.append({"key": device, "operator": "Exists", "effect": "NoSchedule"})
    pod: Obj = {
        "restartPolicy": "Never",  # restarts are the operator's: the whole group at once
        "enableServiceLinks": False,
        # The account's token goes to the worker container alone (TOKEN_VOLUME), not to init
        # containers, sidecars or an MPI launcher.
        "automountServiceAccountToken": False,
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
        # The user's account wins; the reporter's RoleBinding names it only when the job
        # says so (`reports`).
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


def reports(job: DDPTrainingJob) -> bool:
    """Whether the workers' account may report on the job: the job's own account, or the
    template's serviceAccountName where template.serviceAccountReports says so (every pod of
    that account may then write this job's reported status fields)."""
    template = job.spec.template
    return template.service_account_name is None or template.service_account_reports


def build_reporter_rbac(job: DDPTrainingJob) -> list[Obj]:
    """ServiceAccount, Role and RoleBinding that allow exactly one thing: get and patch this
    job's status (the trainer's rank 0 writes status.training through them). The binding
    names the job's own account and, where `reports`, the user's account the workers then
    run as."""
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
                for name in dict.fromkeys(
                    [account, job.spec.template.service_account_name if reports(job) else None]
                )
                if name
            ],
        },
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
    # torchrun's workers are the operator's alone to label (pod_policy); the MPI Operator's
    # pods carry the job's name only.
    own_pods = job_labels(job) if job.spec.launcher == "torchrun" else {}
    pods = {"matchLabels": {names.LABEL_JOB_NAME: job.name, **own_pods}}
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
