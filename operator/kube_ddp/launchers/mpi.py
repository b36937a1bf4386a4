"""launcher mpi: a Kubeflow MPIJob (v2beta1) whose launcher runs mpirun over ssh to one worker
pod per node running sshd; the MPI Operator makes the pods, `status.mpi` follows them."""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Sequence
from typing import Final

from ddp_trainer import contract
from kube_ddp import gang, kueue, names
from kube_ddp.api import DDPTrainingJob, DDPTrainingJobSpec, MPIOptions, Obj
from kube_ddp.builders import (
    SHM_VOLUME,
    BuildSettings,
    _container,
    _metadata,
    _pod_metadata,
    _pod_spec,
    container_settings,
    image_fields,
    job_labels,
    trainer_args,
    worker_env,
    writable_dirs,
)

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
        *(e["name"] for e in worker_env(job, None, 0, contract.OPEN_MPI_ENV)),
    ]
    # The workers' sshd listens on ssh_port and trusts the job's key (their start script).
    ssh = (
        f"-p {mpi.ssh_port} -i {job.spec.ssh_dir}/id_rsa -o ConnectionAttempts=10 "
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
                '"$@"',
            ]
        )
    )
    # The kubelet expands `$(NAME)` in a container's command before bash reads it: a value
    # spliced into the script could end its quoting and run there. So every `$` of the script
    # is the kubelet's escape, `$$` (it reads back as written), and the program comes after it
    # as words of its own (`"$@"`), where `$(NAME)` is the kubelet's to expand, as in any pod.
    return ["/bin/bash", "-c", script.replace("$", "$$"), "kube-ddp-launcher", *program]


def sshd_command(job: DDPTrainingJob) -> list[str]:
    """An MPI worker: sshd in the foreground on ssh_port, trusting the job's key, as whichever
    user the image runs (the MPI Operator mounts the key pair at the spec's ssh_dir)."""
    mpi = _mpi(job.spec)
    keys = job.spec.ssh_dir
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
    env = worker_env(job, None, attempt, contract.OPEN_MPI_ENV)
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
            "sshAuthMountPath": spec.ssh_dir,
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


def build(
    job: DDPTrainingJob, attempt: int, settings: BuildSettings, shared: Sequence[Obj], *_: object
) -> list[Obj]:
    """The job's children for `attempt`: the `shared` children, then the MPIJob, whose pods the
    MPI Operator makes. A group is replaced whole: the worker indices, pod names and nodes to
    avoid that `launchers.Build` passes on are the torchrun launcher's."""
    return [*shared, build_mpijob(job, attempt, settings)]


def kueue_pods(job: DDPTrainingJob, settings: BuildSettings) -> dict[str, Obj]:
    """Kueue's pod sets: the MPIJob's launcher and worker templates (Kueue counts their
    requests)."""
    return _mpi_templates(job, 0, settings)
