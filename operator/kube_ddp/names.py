"""Fixed names of the API and of the objects the operator creates (docs/design.md, "Names").

The API coordinates and the env contract are shared with the trainer, which must not import
the operator: they live in `ddp_trainer.contract` and are re-exported here under the
operator's names.
"""

from typing import Final
from urllib.parse import quote

from ddp_trainer import contract
from kube_ddp import __version__

GROUP: Final = contract.API_GROUP
VERSION: Final = contract.API_VERSION
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DDPTrainingJob"
PLURAL: Final = contract.API_PLURAL
SINGULAR: Final = "ddptrainingjob"
# `ddpjobs` too: kubectl does not pluralise short names, and users type `kubectl get ddpjobs`.
SHORT_NAMES: Final = ("ddpjob", "ddpj", "ddpjobs")
CATEGORY: Final = "kubeddp"

MANAGED_BY: Final = "kube-ddp"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_REPLICA_INDEX: Final = f"{GROUP}/replica-index"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
OWNED_LABELS: Final = (LABEL_MANAGED_BY, LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_ATTEMPT)
# launcher mpi under Kueue: the launcher's admitted nodeSelector and tolerations (JSON), on the
# job; the workers' are its spec.template's.
LAUNCHER_PLACEMENT_ANNOTATION: Final = f"{GROUP}/launcher-placement"

TRAINER_REPOSITORY: Final = "ghcr.io/kube-ddp/ddp-trainer"
DEFAULT_TRAINER_IMAGE: Final = f"{TRAINER_REPOSITORY}:{__version__}"
# A release's trainer images: its tag, and the tag with each suffix (release.yaml's matrix).
TRAINER_IMAGE_SUFFIXES: Final = {"cuda": "", "cpu": "-cpu", "mpi": "-mpi"}
TRAINER_IMAGE_GID: Final = contract.IMAGE_GID
TRAINER_CONTAINER: Final = "trainer"

# The job's NetworkPolicy (builders.build_network_policy).
NETWORK_POLICY_API_VERSION: Final = "networking.k8s.io/v1"
NETWORK_POLICY_KIND: Final = "NetworkPolicy"
NETWORK_POLICY_PLURAL: Final = "networkpolicies"

# The Kubeflow MPI Operator's job kind, which `launcher: mpi` creates.
MPIJOB_API_VERSION: Final = "kubeflow.org/v2beta1"
MPIJOB_KIND: Final = "MPIJob"
MPIJOB_PLURAL: Final = "mpijobs"
# Labels the MPI Operator puts on the pods it creates (never ours: kube-ddp tells its own
# workers from the MPI Operator's launcher and workers by them).
MPI_LABEL_ROLE: Final = "training.kubeflow.org/job-role"  # "launcher" or "worker"
MPI_LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
MPI_LAUNCHER: Final = "launcher"
MPI_LAUNCHER_OWNER_KIND: Final = "Job"  # the launcher pod's controller: the MPI Operator's Job
MPI_WORKER: Final = "worker"


def mpi_launcher_job(mpijob: str) -> str:
    """The batch Job the MPI Operator makes for an MPIJob's launcher (its launcherSuffix): one
    name per namespace, so the pod it controls is that MPIJob's launcher."""
    return f"{mpijob}-launcher"


# The trainer's exit codes the default rules retry: a failure a later attempt may not meet (a
# download), and a collective that timed out or a peer that went away.
EXIT_TEMPORARY: Final = contract.EXIT_TEMPORARY
EXIT_PEER_LOST: Final = contract.EXIT_PEER_LOST
RANK_RESTART_FIELD: Final = contract.RANK_RESTART_FIELD
# The trainer saved a checkpoint on SIGTERM and stopped: a preemption, resumed, never a failure.
EXIT_PREEMPTED: Final = contract.EXIT_PREEMPTED

# The env contract: set by the operator on every worker, refused in a spec's own env.
RESERVED_ENV: Final = contract.RESERVED_ENV

# Silent failures: the trainer's heartbeat and the shortest progress deadline.
HEARTBEAT_SECONDS: Final = contract.HEARTBEAT_SECONDS
MIN_PROGRESS_DEADLINE_SECONDS: Final = contract.MIN_PROGRESS_DEADLINE_SECONDS
# A job without progressDeadlineSeconds gets this many times the longest gap between rank 0's
# reports: a healthy group's gaps vary little once an epoch (validation, a checkpoint) is seen;
# and never less than the minimum, which leaves an elastic group's new rendezvous its time.
LEARNED_DEADLINE_FACTOR: Final = 5
MIN_LEARNED_DEADLINE_SECONDS: Final = 2 * MIN_PROGRESS_DEADLINE_SECONDS
STRAGGLER_RATIO: Final = contract.STRAGGLER_RATIO
# How long the pods created after a worker was lost to its node prefer other nodes.
AVOID_NODE_SECONDS: Final = 600
# The taints the node controller puts on a node that stopped reporting (unreachable) or says
# it is not ready; the taint manager evicts pods that do not tolerate them.
NODE_LOST_TAINTS: Final = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
# Seconds a worker tolerates them by default: with the node controller's grace period (50 s),
# a group is restarted about a minute after its node's last report.
DEFAULT_UNREACHABLE_TOLERATION_SECONDS: Final = 10
# A worker still creating its containers this long after it was placed has the kubelet's
# FailedMount Events read (a volume it cannot mount is said nowhere else), and again this often
# while it stays so (an image pull looks the same and may take minutes).
MOUNT_LOOK_AFTER_SECONDS: Final = 10
MOUNT_RELOOK_SECONDS: Final = 30


def path_segment(name: str) -> str:
    """`name` as one segment of a request path: every character but letters, digits and
    `-._~` escaped, and a dot-segment (`.`, `..`), which an HTTP library would resolve, as
    `%2E`s, so that no name, whoever wrote it, reaches another path."""
    if name in (".", ".."):
        return name.replace(".", "%2E")
    return quote(name, safe="")


def worker_name(job: str, index: int) -> str:
    """Worker `index`'s hostname (its DNS name in the job's Service) and its first pod's name."""
    return f"{job}-worker-{index}"


def successor_name(job: str, index: int, generation: int) -> str:
    """The name of a replaced worker's pod: `generation` 0 is its first name, 1 and on are
    `<first name>-r<generation>`, for a successor created while its predecessor still holds the
    first name. Its hostname stays `worker_name`."""
    first = worker_name(job, index)
    return first if generation == 0 else f"{first}-r{generation}"


def worker_index(job: str, pod_name: str) -> int | None:
    """The worker index in a pod name `worker_name` or `successor_name` gave; None for another."""
    prefix = worker_name(job, 0)[:-1]
    suffix = pod_name.removeprefix(prefix)
    index, marked, generation = suffix.partition("-r")
    if suffix == pod_name or not index.isdigit() or (marked and not generation.isdigit()):
        return None
    return int(index)


def master_addr(job: str, namespace: str) -> str:
    return f"{worker_name(job, 0)}.{job}.{namespace}.svc"
