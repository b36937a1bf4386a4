"""The contract between kube-ddp and the processes it launches, in one place for both sides.

The operator (`kube_ddp`) imports these names to build every worker's environment and the
CRD; the trainer reads the same names and patches the same status endpoint. The trainer never
imports the operator, so the contract lives here, standard library only (docs/design.md, "The
env contract").
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

# --- the status API the trainer's rank 0 reports to ---------------------------------------------
API_GROUP: Final = "kubeddp.io"
API_VERSION: Final = "v1alpha1"
API_PLURAL: Final = "ddptrainingjobs"
# Where rank 0 reports instead of the in-cluster API server, and the token and CA it uses there:
# `kube-ddp run --local` (and the tests) set them; empty or unset, the pod's service account's
# are used. The operator sets all three empty on every worker, so that no `envFrom` source can
# send the job's token elsewhere (an explicit env entry wins over envFrom).
API_SERVER_ENV: Final = "KUBEDDP_API_SERVER"
TOKEN_FILE_ENV: Final = "KUBEDDP_TOKEN_FILE"
CA_FILE_ENV: Final = "KUBEDDP_CA_FILE"
REPORTER_ENV: Final = (API_SERVER_ENV, TOKEN_FILE_ENV, CA_FILE_ENV)
# "false" where the pods run as an account the job does not let report (the template's own
# serviceAccountName without template.serviceAccountReports): rank 0 and the agent then
# report nothing rather than retry a refused request.
REPORT_ENV: Final = "KUBEDDP_REPORT"

# --- bounds the CRD, the operator and the trainer keep alike --------------------------------
# The longest duration anything may be given (ten years): any time it is added to stays a date.
MAX_SECONDS: Final = 10 * 365 * 24 * 3600
MAX_PATH: Final = 4096  # a path or URI (Linux's PATH_MAX)
MAX_EPOCHS: Final = 1_000_000
# The largest integer every JSON reader holds exactly (the API server reads a larger bound as
# a float, which it refuses as a bound): a count of steps and a generation stay below it.
MAX_INT: Final = 2**53 - 1
# A reported loss or rate beyond this is sent as null, as a non-finite one is: it diverged.
MAX_METRIC: Final = 1e15
MESSAGE_LENGTH: Final = 32768  # a message in the status, as long as a Kubernetes condition's

# --- how a worker runs the trainer ----------------------------------------------------------
TRAINER_MODULE: Final = "ddp_trainer"  # python -m ddp_trainer
TRAINER_COMMAND: Final = ("python", "-m", TRAINER_MODULE)
# torchrun that exits as its failed rank did (128 + the signal that killed it, or the rank's own
# code), where torchrun exits 1: in front of the ranks of every image that holds this package.
TORCHRUN_MODULE: Final = f"{TRAINER_MODULE}.torchrun"
TORCHRUN_COMMAND: Final = ("python", "-m", TORCHRUN_MODULE)
# The user and group the trainer image runs as (trainer_image/Dockerfile's USER): the
# operator gives worker pods this fsGroup, so volumes are writable by it.
IMAGE_UID: Final = 10001
IMAGE_GID: Final = 10001
# Its exit codes besides 0 (ddp_trainer.errors): the operator restarts the group for
# EXIT_TEMPORARY (sysexits' EX_TEMPFAIL) and fails the job for the others.
EXIT_FAILED: Final = 1  # the data, model or checkpoint is wrong
EXIT_USAGE: Final = 2  # invalid options
EXIT_TEMPORARY: Final = 75  # a download failed: a later attempt may succeed
# The job must change (a path that cannot be used, more processes than devices): EX_CONFIG.
EXIT_CONFIG: Final = 78
# Saved a checkpoint on SIGTERM (a suspend, an eviction, a drain, the operator's own group
# restart) and stopped: the operator resumes the group and does not count it as a failure.
EXIT_PREEMPTED: Final = 86

# --- the env contract: every worker container gets these ------------------------------------
MASTER_ADDR: Final = "MASTER_ADDR"
MASTER_PORT: Final = "MASTER_PORT"
DEFAULT_PORT: Final = 29500  # spec.port's default, and the trainer's where MASTER_PORT is unset
NNODES: Final = "NNODES"
NODE_RANK: Final = "NODE_RANK"
NPROC_PER_NODE: Final = "NPROC_PER_NODE"
LOCAL_WORLD_SIZE: Final = "LOCAL_WORLD_SIZE"
WORLD_SIZE: Final = "WORLD_SIZE"
RANK: Final = "RANK"  # only when a pod runs exactly one process without torchrun
LOCAL_RANK: Final = "LOCAL_RANK"  # likewise
DDP_BACKEND: Final = "DDP_BACKEND"
JOB_NAME: Final = "KUBEDDP_JOB_NAME"
JOB_NAMESPACE: Final = "KUBEDDP_JOB_NAMESPACE"
ATTEMPT: Final = "KUBEDDP_ATTEMPT"
# The pod and node a rank runs in (the downward API's metadata.name and spec.nodeName), so that
# the rank that stopped first can be named where it ran.
POD_NAME: Final = "KUBEDDP_POD_NAME"
NODE_NAME: Final = "KUBEDDP_NODE_NAME"
FIELD_OF: Final = {POD_NAME: "metadata.name", NODE_NAME: "spec.nodeName"}

# torchrun reads its flags from PET_<FLAG> too; the operator sets both spellings.
TORCHRUN_PREFIX: Final = "PET_"
TORCHRUN_MIRRORED: Final = (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, NPROC_PER_NODE)


def torchrun_name(name: str) -> str:
    """PET_MASTER_ADDR for MASTER_ADDR: the name torchrun reads the same setting from."""
    return TORCHRUN_PREFIX + name


# The failure rules the agent (ddp_trainer.torchrun) applies to its own ranks before it restarts
# them in place, the same the operator applies to pods: runPolicy.restartPolicy and
# runPolicy.retryableExitCodes (comma-separated), set by the operator on every worker.
RESTART_POLICY_ENV: Final = "KUBEDDP_RESTART_POLICY"
RETRYABLE_EXIT_CODES_ENV: Final = "KUBEDDP_RETRYABLE_EXIT_CODES"
# runPolicy.restartPolicy's default, and the agent's where RESTART_POLICY_ENV is unset
DEFAULT_RESTART_POLICY: Final = "ExitCode"

# Every name the operator may set, built from the names above so the two cannot drift: a job
# that sets one of these in its own env is refused.
RESERVED_ENV: Final = (
    *TORCHRUN_MIRRORED,
    *(torchrun_name(name) for name in TORCHRUN_MIRRORED),
    LOCAL_WORLD_SIZE,
    WORLD_SIZE,
    RANK,
    LOCAL_RANK,
    DDP_BACKEND,
    JOB_NAME,
    JOB_NAMESPACE,
    ATTEMPT,
    *FIELD_OF,
    *REPORTER_ENV,
    REPORT_ENV,
    RESTART_POLICY_ENV,
    RETRYABLE_EXIT_CODES_ENV,
)

# The threads of each rank's CPU ops (OpenMP's): where unset, they share the node's cores (set
# by ddp_trainer.torchrun for several ranks and by `kube-ddp run --local`; else the trainer
# divides the cores among the node's ranks itself).
CPU_THREADS_ENV: Final = "OMP_NUM_THREADS"

# What `kube-ddp run --local` gives each worker process besides its pod's env, as a cluster
# would: the GPUs its pod would hold (empty: a cpu pod sees no GPU), and its logs as they happen,
# not when a pipe buffer fills (the trainer image sets the latter itself).
VISIBLE_GPUS_ENV: Final = "CUDA_VISIBLE_DEVICES"
UNBUFFERED_ENV: Final = "PYTHONUNBUFFERED"

# MLflow's own defaults retry a server that does not answer for minutes (7 tries of up to
# 120 s): rank 0 would hold its peers past their collective timeout. Rank 0 sets these in its
# own process where unset, so they give up within a minute; a job's own env wins.
MLFLOW_HTTP_ENV: Final = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}

# --- silent failures: progress heartbeats and a lost peer ------------------------------------
# Rank 0 reports its progress (status.training) at least this often while it trains, so that
# runPolicy.progressDeadlineSeconds can tell a hung group from a slow epoch; a deadline must
# span two heartbeats.
HEARTBEAT_SECONDS: Final = 30
HEARTBEAT_ENV: Final = "KUBEDDP_HEARTBEAT_SECONDS"  # a shorter heartbeat, for tests
MIN_PROGRESS_DEADLINE_SECONDS: Final = 2 * HEARTBEAT_SECONDS
# A rank whose own part of each step takes this many times the median of the others' is a
# straggler: rank 0 reports it (status.training.straggler), the operator says it on the job.
STRAGGLER_RATIO: Final = 1.5
# Where torch writes each rank's flight-recorder dump (a path prefix; torch adds the rank; torch
# 2.15 also reads TORCH_FR_DUMP_TEMP_FILE): the operator points it beside the checkpoints and
# the trainer creates its directory.
FLIGHT_RECORDER_FILE: Final = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
# NCCL's watchdog, so that a hung collective or a lost peer ends the process in a bounded time
# and leaves a trace of where each rank was (docs/design.md, "Hangs and lost peers"). Each was
# read in the pinned torch 2.15 (ProcessGroupNCCL.hpp, FlightRecorder.hpp); set although some
# are 2.15's defaults, because images of their own carry older torch where they were not. The
# operator sets them on every worker of a job on NCCL, as defaults the job's own env overrides.
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
# The trainer's exit code when a collective timed out or a peer went away (torch.distributed
# raised, not the program): the operator's default rules restart the group for it.
EXIT_PEER_LOST: Final = 88

# --- restarts in place: the pod's agent restarts its ranks, the pods stay -----------------------
# (the env the agent reads its failure rules from is with the env contract above)
# torchrun's c10d rendezvous keeps one TCP store for all its rounds, and the ranks share it
# without a prefix per round: restarted ranks, across nodes whose agents count their restarts
# differently, read the dead group's addresses from it (gloo: connection refused; NCCL: a stale
# unique id), pytorch/pytorch#135712. Set to 1, each round's ranks get a store of their own
# (rank 0 hosts it on a free port of its node). Wherever a torchrun agent may restart its ranks,
# this is set.
OWN_WORKER_STORE_ENV: Final = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# How long torchrun's agent waits for the ranks it stopped (SIGTERM, the pod stopping) before
# it SIGKILLs them: torch's default, 30 s, would kill a rank mid-save; the pod's grace period is
# the limit that counts. Set by ddp_trainer.torchrun unless set.
SHUTDOWN_TIMEOUT_ENV: Final = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
SHUTDOWN_TIMEOUT_S: Final = 3600
SIGNALLED: Final = 128  # a process killed by signal n ends as 128 + n, as the kubelet reports it
# The status field the agent that restarted the group in place merge-patches (RankRestart in the
# operator's api): the operator counts it in status.restarts and says it in an Event.
RANK_RESTART_FIELD: Final = "rankRestart"


def exit_restarts(code: int, policy: str, retryable: Collection[int] = ()) -> bool:
    """Whether a rank's or pod's exit `code` restarts the group (in place or recreated) under
    restartPolicy `policy` (docs/design.md, "Failure rules"): under ExitCode, a signal (>= 128:
    OOM, SIGKILL), a failed download, a lost peer, or a code the job lists as retryable."""
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return True
    return code >= SIGNALLED or code in (EXIT_TEMPORARY, EXIT_PEER_LOST) or code in retryable


# --- Open MPI: launcher mpi ----------------------------------------------------------------
# Open MPI 4.1's orted shares its hwloc topology through shared memory mapped at a fixed
# address; with Debian's 4.1.4 one orted start in ten segfaults there (hwloc_shmem_topology_write,
# measured on the dev machine). Without it each rank reads the topology itself. mpirun passes
# its OMPI_MCA_ variables on to every orted; Open MPI 5 has no such parameter and ignores it.
# The operator sets it on every pod of an mpi job, as a default the job's own env overrides.
OPEN_MPI_ENV: Final = {"OMPI_MCA_rtc_hwloc_vmhole": "none"}


# --- checkpoints in an S3-compatible object store ------------------------------------------
# `checkpointDir: s3://BUCKET[/PREFIX]` (ddp_trainer.stores): a bucket name as S3 allows it,
# 3-63 lowercase letters, digits, dots and hyphens, a letter or digit at each end.
S3_SCHEME: Final = "s3://"
S3_URI_PATTERN: Final = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
# The keys of the Secret a job's checkpointStore.secretName names, each the AWS variable of the
# same name on every worker: the first two required, the others taken where the Secret has them.
S3_SECRET_KEYS: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3_OPTIONAL_SECRET_KEYS: Final = ("AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL")
