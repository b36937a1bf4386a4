"""Fixed names of the API and of the objects the operator creates (see DESIGN.md)."""

from typing import Final

GROUP: Final = "kubeddp.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DDPTrainingJob"
PLURAL: Final = "ddptrainingjobs"
SINGULAR: Final = "ddptrainingjob"
# `ddpjobs` too: kubectl does not pluralise short names, and DESIGN.md says `kubectl get ddpjobs`.
SHORT_NAMES: Final = ("ddpjob", "ddpj", "ddpjobs")
CATEGORY: Final = "kubeddp"

MANAGED_BY: Final = "kube-ddp"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_REPLICA_INDEX: Final = f"{GROUP}/replica-index"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
OWNED_LABELS: Final = (LABEL_MANAGED_BY, LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_ATTEMPT)

DEFAULT_TRAINER_IMAGE: Final = "ghcr.io/kube-ddp/ddp-trainer:0.1.0"
TRAINER_CONTAINER: Final = "trainer"

# The env contract: set by the operator on every worker, refused in a spec's own env.
RESERVED_ENV: Final = (
    "MASTER_ADDR",
    "PET_MASTER_ADDR",
    "MASTER_PORT",
    "PET_MASTER_PORT",
    "NNODES",
    "PET_NNODES",
    "NODE_RANK",
    "PET_NODE_RANK",
    "NPROC_PER_NODE",
    "PET_NPROC_PER_NODE",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "DDP_BACKEND",
    "KUBEDDP_JOB_NAME",
    "KUBEDDP_JOB_NAMESPACE",
    "KUBEDDP_ATTEMPT",
)


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def master_addr(job: str, namespace: str) -> str:
    return f"{worker_name(job, 0)}.{job}.{namespace}.svc"
