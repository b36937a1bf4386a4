"""The builders: the env contract as a table, merging rules, the MPIJob, strict validity."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from ddp_trainer import contract
from ddp_trainer.options import TrainerOptions, parse_argv, to_argv
from kube_ddp import names
from kube_ddp.api import MAX_COUNT, MAX_NODES, MAX_PORT, MAX_SECONDS, MIN_PORT, JobStatus
from kube_ddp.builders import (
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    TOKEN_DIR,
    BuildSettings,
    node_lost_tolerations,
    trainer_image,
)
from kube_ddp.launchers import build_children
from kube_ddp.launchers.mpi import LAUNCHER_REQUESTS, build_mpijob, mpi_admission_probes
from kube_ddp.launchers.torchrun import build_worker_pod
from kube_ddp.status import decide
from tests.unit.support import kubelet_argv, make_job, validate_strict
from tests.unit.test_status import NOW

TORCHRUN = contract.TORCHRUN_COMMAND

SETTINGS = BuildSettings(trainer_image="registry.example/trainer:1")


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """Each variable's value; one from the downward API as `fieldRef:<path>`."""
    return {e["name"]: e.get("value", "") or _field_ref(e) for e in container["env"]}


def _field_ref(variable: dict[str, Any]) -> str:
    path = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    return f"fieldRef:{path}" if path else ""


def worker(spec: dict[str, Any], index: int = 0, attempt: int = 0) -> dict[str, Any]:
    pod = build_worker_pod(make_job(**spec), index, attempt, SETTINGS)
    validate_strict(pod)
    return pod


def container_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return dict(container)


MASTER = "bar-worker-0.bar.ns1.svc"
GPU_2X8 = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}}
GAUDI_2X8 = {"nodes": 2, "accelerator": {"type": "gaudi", "perNode": 8}}
ELASTIC = {"nodes": 2, "elastic": {"minNodes": 1, "maxNodes": 4}, "nprocPerNode": 2}
# worker 1's contract env under ELASTIC: the range, its rank, the most ranks
ELASTIC_WORKER_1_ENV = {
    "NNODES": "1:4",
    "NODE_RANK": "1",
    "NPROC_PER_NODE": "2",
    "WORLD_SIZE": "4",
    "DDP_BACKEND": "gloo",
}
# The group path: every pod recreated on a restart (restarts in place are the default)
RECREATE = {"runPolicy": {"restartStrategy": "Recreate"}}
# An NCCL job's watchdog: a hang or a lost peer ends the process in bounded time, with a trace.
NCCL_WATCHDOG = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


@dataclass(frozen=True)
class ContractCase:
    id: str
    spec: dict[str, Any]
    index: int  # the worker looked at
    env: dict[str, str]  # what this shape sets beyond the names every worker gets
    command: list[str]  # the head of the launcher command
    launcher_defaults: dict[str, str] = field(default_factory=dict)


def every_worker_gets(index_env: dict[str, str], c10d: bool = False) -> dict[str, str]:
    """The names set the same way on every worker of every shape, and torchrun's PET_ copies
    of the case's own: not the node's rank where kube-ddp's torchrun joins a c10d rendezvous,
    which numbers the nodes itself (torchrun warns of one given)."""
    mirrored = ("NNODES", "NPROC_PER_NODE") if c10d else ("NNODES", "NODE_RANK", "NPROC_PER_NODE")
    return {
        "MASTER_ADDR": MASTER,
        "PET_MASTER_ADDR": MASTER,
        "MASTER_PORT": "29502",  # port + attempt: attempt 2
        "PET_MASTER_PORT": "29502",
        "LOCAL_WORLD_SIZE": index_env["NPROC_PER_NODE"],
        "KUBEDDP_JOB_NAME": "bar",
        "KUBEDDP_JOB_NAMESPACE": "ns1",
        "KUBEDDP_ATTEMPT": "2",
        # empty: the pod's own API server, token and CA (no envFrom source can redirect them)
        "KUBEDDP_API_SERVER": "",
        "KUBEDDP_TOKEN_FILE": "",
        "KUBEDDP_CA_FILE": "",
        "KUBEDDP_POD_NAME": "fieldRef:metadata.name",  # where a rank ran, to name one that hung
        "KUBEDDP_NODE_NAME": "fieldRef:spec.nodeName",
        **{f"PET_{name}": index_env[name] for name in mirrored},
    }


# torchrun's restarts (elastic, or in place) re-form the group on a store of their own
# (contract.OWN_WORKER_STORE_ENV says why)
SEPARATE_RDZV_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# What the pod's agent reads its failure rules from, where the ranks restart in place
IN_PLACE_ENV = {"KUBEDDP_RESTART_POLICY": "ExitCode", "KUBEDDP_RETRYABLE_EXIT_CODES": ""}
# The c10d rendezvous on worker 0's store (then `is_host`, which says whose store it is)
IN_PLACE_RDZV = [
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
    "--rdzv-id=bar",
]

CONTRACT = [
    ContractCase(
        id="1x1 cpu",
        spec={"nodes": 1, **RECREATE},
        index=0,
        env={
            "NNODES": "1",
            "NODE_RANK": "0",
            "NPROC_PER_NODE": "1",
            "WORLD_SIZE": "1",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "DDP_BACKEND": "gloo",
        },
        command=["python", "-m", "ddp_trainer"],
    ),
    ContractCase(
        id="2x8 nvidia, worker 1",
        spec={**GPU_2X8, **RECREATE},
        index=1,
        env={
            "NNODES": "2",
            "NODE_RANK": "1",
            "NPROC_PER_NODE": "8",
            "WORLD_SIZE": "16",
            "DDP_BACKEND": "nccl",
        },
        command=[*TORCHRUN, "--nnodes=2", "--nproc-per-node=8", "--node-rank=$(NODE_RANK)"],
        launcher_defaults=NCCL_WATCHDOG,
    ),
    ContractCase(
        id="2x8 gaudi",
        spec={**GAUDI_2X8, **RECREATE},
        index=0,
        env={
            "NNODES": "2",
            "NODE_RANK": "0",
            "NPROC_PER_NODE": "8",
            "WORLD_SIZE": "16",
            "DDP_BACKEND": "hccl",
        },
        command=[*TORCHRUN, "--nnodes=2", "--nproc-per-node=8"],
    ),
    ContractCase(
        id="elastic 1:4 x 2",
        spec={**ELASTIC, **RECREATE},
        index=1,
        env=ELASTIC_WORKER_1_ENV,
        command=[
            *TORCHRUN,
            "--nnodes=1:4",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
            "--rdzv-id=bar",
            "--max-restarts=3",
        ],
        # torchrun restarts across nodes need it (contract.OWN_WORKER_STORE_ENV)
        launcher_defaults={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    ),
    ContractCase(
        id="1x1 cpu in place",
        spec={"nodes": 1},
        index=0,
        env={
            "NNODES": "1",
            "NODE_RANK": "0",
            "NPROC_PER_NODE": "1",
            "WORLD_SIZE": "1",
            "DDP_BACKEND": "gloo",
            **IN_PLACE_ENV,
        },
        command=[
            *TORCHRUN,
            "--nnodes=1",
            "--nproc-per-node=1",
            *IN_PLACE_RDZV,
            "--rdzv-conf=is_host=true",
        ],
        launcher_defaults=SEPARATE_RDZV_STORE,
    ),
    ContractCase(
        id="2x8 nvidia in place, worker 1",
        spec={**GPU_2X8, "runPolicy": {"backoffLimit": 5, "retryableExitCodes": [3, 4]}},
        index=1,
        env={
            "NNODES": "2",
            "NODE_RANK": "1",
            "NPROC_PER_NODE": "8",
            "WORLD_SIZE": "16",
            "DDP_BACKEND": "nccl",
            **IN_PLACE_ENV,
            "KUBEDDP_RETRYABLE_EXIT_CODES": "3,4",
        },
        command=[
            *TORCHRUN,
            "--nnodes=2",
            "--nproc-per-node=8",
            *IN_PLACE_RDZV,
            "--rdzv-conf=is_host=false",
            "--max-restarts=5",
        ],
        launcher_defaults={**NCCL_WATCHDOG, **SEPARATE_RDZV_STORE},
    ),
    ContractCase(
        id="elastic 1:4 x 2 in place",
        spec=ELASTIC,
        index=1,
        env={
            **ELASTIC_WORKER_1_ENV,
            **IN_PLACE_ENV,
        },
        command=[
            *TORCHRUN,
            "--nnodes=1:4",
            "--nproc-per-node=2",
            *IN_PLACE_RDZV,
            "--rdzv-conf=is_host=false",
        ],
        launcher_defaults=SEPARATE_RDZV_STORE,
    ),
]


def test_each_attempt_rendezvous_on_its_own_port() -> None:
    """A rank of an earlier attempt, its node back after it was taken for lost, finds no
    store on its attempt's port and can never join a later group."""
    for attempt in (0, 1, 3):
        container = container_of(worker({"nodes": 2, "port": 23000}, 1, attempt=attempt))
        port = 23000 + attempt
        assert env_of(container)["MASTER_PORT"] == str(port)
        assert container["ports"] == [{"name": "ddp", "containerPort": port, "protocol": "TCP"}]


@pytest.mark.parametrize("case", CONTRACT, ids=[case.id for case in CONTRACT])
def test_env_contract(case: ContractCase) -> None:
    container = container_of(worker(case.spec, case.index, attempt=2))
    assert env_of(container) == {
        **every_worker_gets(case.env, c10d="--rdzv-backend=c10d" in case.command),
        **case.env,
        **case.launcher_defaults,
    }
    assert container["command"][: len(case.command)] == case.command
    assert container["command"][-2:] == ["-m", "ddp_trainer"]


def test_pod_identity_labels_and_dns() -> None:
    pod = worker(GPU_2X8, index=1, attempt=3)
    assert pod["metadata"]["name"] == "bar-worker-1"
    assert pod["metadata"]["namespace"] == "ns1"
    assert pod["metadata"]["labels"] == {
        names.LABEL_MANAGED_BY: "kube-ddp",
        names.LABEL_JOB_NAME: "bar",
        names.LABEL_REPLICA_INDEX: "1",
        names.LABEL_ATTEMPT: "3",
    }
    assert pod["spec"]["hostname"] == "bar-worker-1"
    assert pod["spec"]["subdomain"] == "bar"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert "ownerReferences" not in pod["metadata"]


def test_a_successor_pod_keeps_its_workers_hostname_and_labels() -> None:
    """Created beside its predecessor under another name: the same DNS name and index."""
    first = worker(GPU_2X8, index=1, attempt=3)
    (successor,) = [
        c
        for c in build_children(make_job(**GPU_2X8), 3, SETTINGS, (1,), ("bar-worker-1-r1",))
        if c["kind"] == "Pod"
    ]
    validate_strict(successor)
    assert successor["metadata"]["name"] == "bar-worker-1-r1"
    assert successor["spec"] == first["spec"]
    assert successor["metadata"]["labels"] == first["metadata"]["labels"]


def test_children_in_creation_order() -> None:
    children = build_children(make_job(**GPU_2X8), settings=SETTINGS)
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("Service", "bar"),
        ("NetworkPolicy", "bar"),
        ("ServiceAccount", "bar-trainer"),
        ("Role", "bar-trainer"),
        ("RoleBinding", "bar-trainer"),
        ("Pod", "bar-worker-0"),
        ("Pod", "bar-worker-1"),
    ]
    for child in children:
        validate_strict(child)
        assert child["metadata"]["labels"][names.LABEL_JOB_NAME] == "bar"


def test_reporter_may_only_touch_its_own_jobs_status() -> None:
    _, _, account, role, binding, *pods = build_children(make_job(**GPU_2X8), settings=SETTINGS)
    assert role["rules"] == [
        {
            "apiGroups": ["kubeddp.io"],
            "resources": ["ddptrainingjobs/status"],
            "resourceNames": ["bar"],
            "verbs": ["get", "patch"],
        }
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "ns1"}
    ]
    assert {p["spec"]["serviceAccountName"] for p in pods} == {"bar-trainer"}


def worker_values(pod: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_the_users_service_account_reports_only_when_the_job_says_so() -> None:
    """Binding the user's account would let every pod of it write this job's reported
    status: without serviceAccountReports it is left unbound, and the trainer told so."""
    job = make_job(**GPU_2X8, template={"serviceAccountName": "mine"})
    _, _, account, _, binding, *pods = build_children(job, settings=SETTINGS)
    assert [s["name"] for s in binding["subjects"]] == [account["metadata"]["name"]]
    assert {p["spec"]["serviceAccountName"] for p in pods} == {"mine"}
    assert {worker_values(p)["KUBEDDP_REPORT"] for p in pods} == {"false"}

    job = make_job(
        **GPU_2X8, template={"serviceAccountName": "mine", "serviceAccountReports": True}
    )
    _, _, account, _, binding, *pods = build_children(job, settings=SETTINGS)
    assert [s["name"] for s in binding["subjects"]] == [account["metadata"]["name"], "mine"]
    assert all("KUBEDDP_REPORT" not in worker_values(p) for p in pods)


def test_no_env_from_source_can_redirect_the_reports() -> None:
    """An explicit env entry wins over envFrom: the reporter's overrides are set empty."""
    job = make_job(
        **GPU_2X8, template={"container": {"envFrom": [{"configMapRef": {"name": "x"}}]}}
    )
    pods = build_children(job, settings=SETTINGS)[5:]
    for name in ("KUBEDDP_API_SERVER", "KUBEDDP_TOKEN_FILE", "KUBEDDP_CA_FILE"):
        assert {worker_values(p)[name] for p in pods} == {""}


def test_service_is_headless_and_selects_the_job() -> None:
    children = build_children(make_job(**GPU_2X8), settings=SETTINGS)
    service = children[0]
    pods = [c for c in children if c["kind"] == "Pod"]
    assert service["metadata"]["name"] == "bar"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    # the workers' DNS names go to pods only the operator may label so (pod_policy)
    assert service["spec"]["selector"][names.LABEL_MANAGED_BY] == names.MANAGED_BY
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
    assert [p["metadata"]["name"] for p in pods] == ["bar-worker-0", "bar-worker-1"]


def test_gpu_resources_and_toleration() -> None:
    pod = worker({**GPU_2X8, "resources": {"requests": {"cpu": 16, "memory": "64Gi"}}})
    assert container_of(pod)["resources"] == {
        "limits": {"nvidia.com/gpu": 8},
        "requests": {"cpu": 16, "memory": "64Gi", "nvidia.com/gpu": 8},
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]


def test_gaudi_defaults() -> None:
    pod = worker(GAUDI_2X8)
    container = container_of(pod)
    assert pod["spec"]["hostIPC"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]},
    }
    assert container["resources"] == {
        "limits": {"habana.ai/gaudi": 8, "hugepages-2Mi": "95000Mi"},
        "requests": {"habana.ai/gaudi": 8, "hugepages-2Mi": "95000Mi", "memory": "32Gi"},
    }


def test_gaudi_user_resources_win_over_defaults() -> None:
    resources = {
        "limits": {"hugepages-2Mi": "95000Mi", "memory": "409Gi"},
        "requests": {"hugepages-2Mi": "95000Mi", "memory": "409Gi", "cpu": 95},
    }
    pod = worker({**GAUDI_2X8, "resources": resources})
    assert container_of(pod)["resources"] == {
        "limits": {"hugepages-2Mi": "95000Mi", "memory": "409Gi", "habana.ai/gaudi": 8},
        "requests": {
            "hugepages-2Mi": "95000Mi",
            "memory": "409Gi",
            "cpu": 95,
            "habana.ai/gaudi": 8,
        },
    }


def test_cpu_job_has_no_devices_and_only_the_lost_node_tolerations() -> None:
    pod = worker({"nodes": 1})
    assert container_of(pod)["resources"] == {}
    assert pod["spec"]["tolerations"] == node_lost_tolerations(make_job(nodes=1))
    assert "hostIPC" not in pod["spec"]


def unreachable(key: str = "node.kubernetes.io/unreachable", **fields: Any) -> dict[str, Any]:
    return {"key": key, "operator": "Exists", "effect": "NoExecute", **fields}


def test_a_worker_leaves_a_node_that_stopped_reporting_after_10_s_by_default() -> None:
    """Without them the API server gives every pod 300 s on such a node."""
    tolerations = worker({"nodes": 1})["spec"]["tolerations"]
    assert tolerations == [
        unreachable(tolerationSeconds=10),
        unreachable("node.kubernetes.io/not-ready", tolerationSeconds=10),
    ]
    policy = {"runPolicy": {"unreachableTolerationSeconds": 0}}
    tolerations = worker({"nodes": 1, **policy})["spec"]["tolerations"]
    assert [t["tolerationSeconds"] for t in tolerations] == [0, 0]


@pytest.mark.parametrize(
    ("own", "added"),
    [
        (unreachable(tolerationSeconds=600), ["node.kubernetes.io/not-ready"]),
        (unreachable(), ["node.kubernetes.io/not-ready"]),  # for ever: the user's choice
        ({"operator": "Exists"}, []),  # every taint
        (
            {"operator": "Exists", "effect": "NoSchedule"},
            ["node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"],
        ),
        (
            {"key": "dedicated", "operator": "Exists"},
            ["node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"],
        ),
    ],
    ids=["unreachable 600 s", "unreachable for ever", "all taints", "NoSchedule", "another key"],
)
def test_a_template_toleration_of_a_lost_node_taint_is_kept_instead(
    own: dict[str, Any], added: list[str]
) -> None:
    tolerations = worker({"nodes": 1, "template": {"tolerations": [own]}})["spec"]["tolerations"]
    assert tolerations[0] == own
    assert [t["key"] for t in tolerations[1:]] == added


def test_template_is_merged_and_operator_fields_are_kept() -> None:
    template = {
        "labels": {"team": "vision"},
        "annotations": {"sidecar.istio.io/inject": "false"},
        "nodeSelector": {"pool": "a100"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
        "affinity": {"nodeAffinity": {}},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "priorityClassName": "high",
        "schedulerName": "volcano",
        "serviceAccountName": "trainer",
        "securityContext": {"runAsUser": 1000},
    }
    pod = worker({**GPU_2X8, "template": template})
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"][names.LABEL_JOB_NAME] == "bar"
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert spec["nodeSelector"] == {"pool": "a100"}
    assert spec["tolerations"][0]["key"] == "dedicated"
    assert spec["tolerations"][1]["key"] == "nvidia.com/gpu"
    assert [v["name"] for v in spec["volumes"]] == ["data", "dshm", "kube-ddp-token"]
    assert [m["mountPath"] for m in container_of(pod)["volumeMounts"]] == [
        "/data",
        "/dev/shm",
        TOKEN_DIR,
    ]
    assert spec["priorityClassName"] == "high"
    assert spec["schedulerName"] == "volcano"
    assert spec["serviceAccountName"] == "trainer"
    assert spec["securityContext"] == {
        **RESTRICTED_POD_CONTEXT,
        "runAsUser": 1000,
        "fsGroup": names.TRAINER_IMAGE_GID,
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    assert spec["hostname"] == "bar-worker-0"
    assert spec["restartPolicy"] == "Never"


def _mounts(pod: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container_of(pod)["volumeMounts"]}


def test_trainer_dirs_without_a_volume_get_an_emptydir_the_image_user_can_write() -> None:
    trainer = {"dataset": "mnist", "dataDir": "/data", "checkpointDir": "/ckpt"}
    pod = worker({"nodes": 2, "trainer": trainer})
    assert _mounts(pod) == {
        "/data": "ddp-data",
        "/ckpt": "ddp-checkpoints",
        "/dev/shm": "dshm",
        TOKEN_DIR: "kube-ddp-token",
    }
    empty = {v["name"] for v in pod["spec"]["volumes"] if v.get("emptyDir") == {}}
    assert empty == {"ddp-data", "ddp-checkpoints"}
    assert pod["spec"]["securityContext"]["fsGroup"] == 10001


@pytest.mark.parametrize(
    ("trainer", "mounted", "expected"),
    [
        ({"dataDir": "/data/cifar", "checkpointDir": "/data/ckpt"}, "/data", set()),
        ({"dataDir": "/data", "checkpointDir": "/data/ckpt"}, "/other", {"/data"}),
        ({"dataDir": "./data"}, "/other", set()),  # under the image's home
        ({"dataDir": "/data", "checkpointDir": "/ckpt"}, "/", set()),
    ],
)
def test_a_volume_that_holds_a_dir_is_used_as_is(
    trainer: dict[str, str], mounted: str, expected: set[str]
) -> None:
    template = {
        "volumes": [{"name": "mine", "persistentVolumeClaim": {"claimName": "c"}}],
        "volumeMounts": [{"name": "mine", "mountPath": mounted}],
    }
    pod = worker({"nodes": 1, "trainer": trainer, "template": template})
    added = {path for path, name in _mounts(pod).items() if name.startswith("ddp-")}
    assert added == expected


def test_own_command_gets_no_emptydir_and_own_fsgroup_is_kept() -> None:
    spec = {
        "nodes": 1,
        "command": ["python", "train.py"],
        "template": {"securityContext": {"fsGroup": 2000}},
    }
    pod = worker(spec)
    assert set(_mounts(pod)) == {"/dev/shm", TOKEN_DIR}
    assert pod["spec"]["securityContext"] == {**RESTRICTED_POD_CONTEXT, "fsGroup": 2000}


def test_own_dev_shm_mount_replaces_ours() -> None:
    template = {
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    }
    pod = worker({"nodes": 1, "template": template})
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["shm", "kube-ddp-token"]


def test_trainer_options_become_flags() -> None:
    trainer = {"dataset": "digits", "epochs": 3, "targetAccuracy": 0.9, "scaleLr": False}
    container = container_of(worker({**GPU_2X8, "trainer": trainer}))
    assert container["args"] == [
        "--dataset",
        "digits",
        "--epochs",
        "3",
        "--no-scale-lr",
        "--target-accuracy",
        "0.9",
    ]


def test_no_trainer_options_means_no_args() -> None:
    assert "args" not in container_of(worker(GPU_2X8))


def test_own_command_keeps_the_contract_and_user_env_follows_it() -> None:
    spec = {
        **GPU_2X8,
        "image": "me/train:2",
        "imagePullPolicy": "Always",
        "command": ["python", "/app/train.py"],
        "args": ["--lr", "0.1"],
        "env": [
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "URL", "value": "$(MASTER_ADDR)"},
        ],
    }
    container = container_of(worker(spec))
    assert container["command"] == [
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--node-rank=$(NODE_RANK)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
        "--no-python",
        "python",
        "/app/train.py",
    ]
    assert container["args"] == ["--lr", "0.1"]
    assert container["image"] == "me/train:2"
    assert container["imagePullPolicy"] == "Always"
    env_names = [e["name"] for e in container["env"]]
    assert env_names[-2:] == ["NCCL_DEBUG", "URL"]
    assert env_of(container)["WORLD_SIZE"] == "16"


def test_own_command_with_one_process_a_pod_runs_as_the_rank_itself() -> None:
    spec = {"nodes": 2, "command": ["python", "train.py"], **RECREATE}
    container = container_of(worker(spec))
    assert container["command"] == ["python", "train.py"]
    assert (env_of(container)["RANK"], env_of(container)["LOCAL_RANK"]) == ("0", "0")


def test_own_command_under_elastic_gets_torchrun_with_a_rendezvous() -> None:
    spec = {"nodes": 2, "elastic": {"minNodes": 1, "maxNodes": 2}, "command": ["./train"]}
    command = container_of(worker(spec))["command"]
    assert command[:3] == list(TORCHRUN) and "--rdzv-backend=c10d" in command
    assert command[-2:] == ["--no-python", "./train"]


def test_torchrun_in_front_of_ranks_exits_as_the_failed_rank_where_the_image_can() -> None:
    """The trainer image (and any image running the trainer) holds the torchrun that exits
    with the failed rank's own code; an image of the user's own gets torchrun itself."""
    own_script = {"nodes": 2, "nprocPerNode": 2, "command": ["python", "train.py"]}
    assert container_of(worker(own_script))["command"][:3] == list(TORCHRUN)
    trainer_in_own_image = {"nodes": 2, "nprocPerNode": 2, "image": "me/trainer:1"}
    assert container_of(worker(trainer_in_own_image))["command"][:3] == list(TORCHRUN)
    own_image = {**own_script, "image": "me/train:2"}
    assert container_of(worker(own_image))["command"][0] == "torchrun"


@pytest.mark.parametrize(
    "command",
    [
        ["torchrun", "--nproc-per-node=2", "train.py"],
        ["/opt/conda/bin/torchrun", "train.py"],
        ["python", "-m", "torch.distributed.run", "train.py"],
        ["python", "-m", "ddp_trainer.torchrun", "train.py"],
        ["python3", "-u", "-m", "torch.distributed.launch", "train.py"],
        ["accelerate", "launch", "train.py"],
        ["bash", "-c", "pip install -e . && torchrun --nproc-per-node=2 train.py"],
    ],
)
def test_a_command_that_starts_its_own_launcher_is_left_alone(command: list[str]) -> None:
    container = container_of(worker({"nodes": 2, "nprocPerNode": 2, "command": command}))
    assert container["command"] == command
    assert "RANK" not in env_of(container)


def pods_of(job: Any) -> list[dict[str, Any]]:
    """The job's pods, or its MPIJob's launcher and worker templates."""
    pods = []
    for obj in build_children(job, settings=SETTINGS):
        if obj["kind"] == "Pod":
            pods.append(obj)
        elif obj["kind"] == "MPIJob":
            pods += [r["template"] for r in obj["spec"]["mpiReplicaSpecs"].values()]
    return pods


@pytest.mark.parametrize(
    ("spec", "image"),
    [
        ({"nodes": 1}, "registry.example/trainer:1-cpu"),  # multi-arch, no CUDA
        ({"accelerator": {"type": "nvidia", "perNode": 8}}, "registry.example/trainer:1"),
        (
            {"launcher": "mpi", "accelerator": {"type": "nvidia", "perNode": 8}},
            "registry.example/trainer:1-mpi",
        ),
        ({"launcher": "mpi"}, "registry.example/trainer:1-mpi"),
        ({"image": "me/mine:2", "launcher": "mpi"}, "me/mine:2"),
    ],
)
def test_the_default_image_follows_the_job(spec: dict[str, Any], image: str) -> None:
    """CPU jobs the release's CPU image, GPU jobs its CUDA one, MPI jobs its MPI variant: the
    release workflow's tags, from the operator's one setting."""
    job = make_job(**{"nodes": 2, **spec})
    assert {container_of(pod)["image"] for pod in pods_of(job)} == {image}


def test_a_trainer_image_pinned_by_digest_is_taken_whole() -> None:
    pinned = BuildSettings(trainer_image="registry.example/trainer@sha256:" + "0" * 64)
    job = make_job(nodes=1)
    assert trainer_image(job.spec, pinned) == pinned.trainer_image


def test_port_is_used_everywhere() -> None:
    job = make_job(nodes=2, port=23456)
    service, *_, pod, _ = build_children(job, settings=SETTINGS)
    assert service["spec"]["ports"][0]["port"] == 23456
    container = container_of(pod)
    assert env_of(container)["MASTER_PORT"] == "23456"
    assert container["ports"][0]["containerPort"] == 23456


# --- MPIJob -------------------------------------------------------------------------------


def mpijob(spec: dict[str, Any]) -> dict[str, Any]:
    obj = build_mpijob(make_job(launcher="mpi", **spec), 0, SETTINGS)
    for role in ("Launcher", "Worker"):
        template = obj["spec"]["mpiReplicaSpecs"][role]["template"]
        validate_strict({"apiVersion": "v1", "kind": "Pod", **template})
    return obj


def launcher_script(obj: dict[str, Any]) -> list[str]:
    """The launcher's bash line as bash reads it (after the kubelet's expansion), its `"$@"`
    standing for the program's words that follow the script."""
    (container,) = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    argv = kubelet_argv(container)
    assert argv[:2] == ["/bin/bash", "-c"] and argv[3] == "kube-ddp-launcher"
    words = shlex.split(argv[2])
    assert words[-1] == "$@"
    return [*words[:-1], *argv[4:]]


def test_mpijob_for_gaudi() -> None:
    obj = mpijob({**GAUDI_2X8, "trainer": {"epochs": 2}})
    assert obj["apiVersion"] == "kubeflow.org/v2beta1"
    assert obj["kind"] == "MPIJob"
    assert obj["metadata"]["name"] == "bar"
    assert obj["spec"]["slotsPerWorker"] == 8
    # kube-ddp decides restarts: a failed launcher fails the MPIJob at once (docs/mpi.md)
    assert obj["spec"]["runPolicy"] == {
        "backoffLimit": 0,
        "cleanPodPolicy": "Running",
        "suspend": False,
    }
    assert obj["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    words = launcher_script(obj)
    mpirun = words[words.index("mpirun") :]
    assert mpirun[:12] == [
        "mpirun",
        "${MPI_ROOT:+--prefix",  # the image's Open MPI for the orteds ssh starts, where set
        "$MPI_ROOT}",
        "--allow-run-as-root",
        "-np",
        "16",
        "--bind-to",
        "core",
        "--map-by",
        "ppr:4:socket:PE=6",
        "--rank-by",
        "core",
    ]
    assert mpirun[-5:] == ["python", "-m", "ddp_trainer", "--epochs", "2"]
    assert "MASTER_ADDR=${MASTER_ADDR:-$host};" in words  # the first host of the MPI host file
    workers = obj["spec"]["mpiReplicaSpecs"]["Worker"]
    assert workers["replicas"] == 2
    (container,) = workers["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["habana.ai/gaudi"] == 8
    assert env_of(container)["DDP_BACKEND"] == "hccl"
    assert "NODE_RANK" not in env_of(container)
    assert workers["template"]["spec"]["hostIPC"] is True


def test_mpijob_mapping_is_configurable() -> None:
    spec = {
        **GAUDI_2X8,
        "mpi": {"socketsPerNode": 1, "coresPerProcess": 4, "extraArgs": ["--report-bindings"]},
    }
    words = launcher_script(mpijob(spec))
    assert "ppr:8:socket:PE=4" in words
    assert "--report-bindings" in words
    custom = launcher_script(mpijob({**GAUDI_2X8, "mpi": {"mapBy": "socket:PE=6"}}))
    assert custom[custom.index("--map-by") + 1] == "socket:PE=6"


def test_mpijob_exports_the_contract_and_user_env() -> None:
    words = launcher_script(
        mpijob({**GAUDI_2X8, "env": [{"name": "PT_HPU_LAZY_MODE", "value": "0"}]})
    )
    exported = [words[i + 1] for i, w in enumerate(words) if w == "-x"]
    assert exported[0] == "MASTER_ADDR"
    assert {"WORLD_SIZE", "DDP_BACKEND", "KUBEDDP_JOB_NAME", "PT_HPU_LAZY_MODE"} <= set(exported)
    # ranks started over ssh get sshd's environment: python's PATH and the API server's
    # address (rank 0 reports progress) must be passed on
    assert {"PATH", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} <= set(exported)


def test_mpi_launchers_orteds_skip_the_topology_shmem_unless_the_user_says() -> None:
    launcher = mpijob(GAUDI_2X8)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert env_of(launcher["containers"][0]).items() >= contract.OPEN_MPI_ENV.items()
    mine = {"name": "OMPI_MCA_rtc_hwloc_vmhole", "value": "biggest"}
    spec = mpijob({**GAUDI_2X8, "env": [mine]})["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    assert [e for e in spec["spec"]["containers"][0]["env"] if e["name"] == mine["name"]] == [mine]
    assert "OMPI_MCA_rtc_hwloc_vmhole" not in env_of(container_of(worker(GPU_2X8)))


def test_mpi_pods_cannot_be_taken_for_torchrun_workers() -> None:
    """The MPI Operator's pods carry the job's name (so the operator watches them) but not
    `managed-by` nor our replica index: the index of our own workers never sees them."""
    obj = mpijob(GAUDI_2X8)
    assert obj["metadata"]["labels"][names.LABEL_MANAGED_BY] == names.MANAGED_BY
    for role in ("Launcher", "Worker"):
        replica = obj["spec"]["mpiReplicaSpecs"][role]
        labels = replica["template"]["metadata"]["labels"]
        assert labels == {names.LABEL_JOB_NAME: "bar", names.LABEL_ATTEMPT: "0"}
        # the replica's restartPolicy is the MPIJob's; one in the template draws a Warning
        assert "restartPolicy" not in replica["template"]["spec"]
        assert replica["restartPolicy"] == "Never"


def test_mpi_ssh_settings_meet_on_both_ends() -> None:
    """The workers' sshd and the launcher's ssh client use the same port and key path."""
    obj = mpijob({**GAUDI_2X8, "mpi": {"sshPort": 3022, "sshAuthMountPath": "/root/.ssh"}})
    assert obj["spec"]["sshAuthMountPath"] == "/root/.ssh"
    words = launcher_script(obj)
    rsh = words[words.index("plm_rsh_args") + 1]
    assert "-p 3022" in rsh and "-i /root/.ssh/id_rsa" in rsh
    (worker,) = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    script = worker["command"][2]
    assert "Port 3022" in script and "HostKey /root/.ssh/id_rsa" in script
    assert script.endswith("exec /usr/sbin/sshd -D -e -f /tmp/kube-ddp-sshd_config")


def test_mpi_launcher_children_are_one_mpijob() -> None:
    children = build_children(make_job(launcher="mpi", **GAUDI_2X8), settings=SETTINGS)
    assert [c["kind"] for c in children] == [
        "NetworkPolicy",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "MPIJob",
    ]


def test_the_mpi_admission_probes_are_the_pods_the_mpi_operator_will_create() -> None:
    obj = mpijob(GAUDI_2X8)
    launcher, worker = mpi_admission_probes(obj)
    replicas = obj["spec"]["mpiReplicaSpecs"]
    assert (launcher["kind"], launcher["metadata"]["name"]) == ("Pod", "bar-launcher")
    assert worker["metadata"]["name"] == "bar-worker-0"
    assert launcher["spec"] == replicas["Launcher"]["template"]["spec"]
    assert worker["spec"] == replicas["Worker"]["template"]["spec"]
    assert worker["spec"]["hostIPC"] is True  # what a restricted namespace refuses
    assert {p["metadata"]["namespace"] for p in (launcher, worker)} == {"ns1"}


def _policy(job_spec: dict[str, Any], settings: BuildSettings = SETTINGS) -> dict[str, Any] | None:
    children = build_children(make_job(**job_spec), settings=settings)
    return next((c for c in children if c["kind"] == "NetworkPolicy"), None)


def test_the_network_policy_admits_only_the_jobs_own_pods_and_leaves_egress_alone() -> None:
    policy = _policy(GPU_2X8)
    assert policy is not None
    validate_strict(policy)
    spec = policy["spec"]
    # managed-by, which only the operator may put on a pod (pod_policy): labels are proof
    own = {"matchLabels": {names.LABEL_JOB_NAME: "bar", names.LABEL_MANAGED_BY: names.MANAGED_BY}}
    assert spec == {
        "podSelector": own,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": own}]}],
    }
    pods = [c for c in build_children(make_job(**GPU_2X8)) if c["kind"] == "Pod"]
    for pod in pods:  # every pod is both guarded and admitted
        assert own["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_the_network_policy_selects_the_mpi_launcher_and_workers() -> None:
    policy = _policy({"launcher": "mpi", **GAUDI_2X8})
    mpijob = build_mpijob(make_job(launcher="mpi", **GAUDI_2X8), 0, SETTINGS)
    selector = policy["spec"]["podSelector"]["matchLabels"]  # type: ignore[index]
    for replica in mpijob["spec"]["mpiReplicaSpecs"].values():
        assert selector.items() <= replica["template"]["metadata"]["labels"].items()


def test_the_network_policy_can_be_widened_or_turned_off() -> None:
    scraper = {
        "from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}],
        "ports": [{"port": 9090}],
    }
    widened = _policy({**GPU_2X8, "networkPolicy": {"ingress": [scraper]}})
    assert widened is not None and widened["spec"]["ingress"][1:] == [scraper]
    validate_strict(widened)
    assert _policy({**GPU_2X8, "networkPolicy": {"enabled": False}}) is None
    off = BuildSettings(trainer_image="x", network_policy=False)
    assert _policy(GPU_2X8, off) is None  # the operator's default, off
    assert _policy({**GPU_2X8, "networkPolicy": {"enabled": True}}, off) is not None


def test_children_for_some_indices_only() -> None:
    children = build_children(make_job(nodes=4), attempt=2, settings=SETTINGS, indices=(1, 3))
    pods = [c["metadata"]["name"] for c in children if c["kind"] == "Pod"]
    assert pods == ["bar-worker-1", "bar-worker-3"]


def test_users_env_overrides_a_launcher_default() -> None:
    spec = {**ELASTIC, "env": [{"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "0"}]}
    env = container_of(worker(spec))["env"]
    assert [e["value"] for e in env if e["name"] == "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == ["0"]


def test_reserved_env_is_exactly_what_the_builders_set() -> None:
    """The refused names and the injected ones come from one set of constants: every shape of
    job together sets each reserved name, and nothing else of the contract."""
    shapes = [
        make_job(**GPU_2X8),  # torchrun, several processes per pod
        make_job(nodes=2, **RECREATE),  # one process per pod: RANK and LOCAL_RANK too
        make_job(nodes=2),  # restarts in place: the agent's failure rules
        make_job(nodes=2, elastic={"minNodes": 1, "maxNodes": 3}),
        make_job(nodes=2, launcher="mpi"),
        make_job(nodes=1, template={"serviceAccountName": "mine"}),  # KUBEDDP_REPORT
    ]
    injected: set[str] = set()
    for job in shapes:
        for child in build_children(job):
            for container in _containers(child):
                injected |= {e["name"] for e in container["env"]}
    # defaults, overridable
    injected -= {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", *NCCL_WATCHDOG, *contract.OPEN_MPI_ENV}
    assert injected == set(names.RESERVED_ENV)


def test_nccl_jobs_get_the_watchdog_and_the_users_own_setting_wins() -> None:
    spec = {**GPU_2X8, "env": [{"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"}]}
    env = container_of(worker(spec))["env"]
    assert [e["value"] for e in env if e["name"] == "TORCH_NCCL_ASYNC_ERROR_HANDLING"] == ["1"]
    assert env_of(container_of(worker(GPU_2X8))).items() >= NCCL_WATCHDOG.items()
    gloo = env_of(container_of(worker({"nodes": 2, "nprocPerNode": 2})))
    assert not any(name.startswith("TORCH_NCCL_") for name in gloo)


def test_flight_recorder_dumps_go_beside_the_checkpoints_one_name_per_attempt() -> None:
    spec = {"nodes": 2, "trainer": {"checkpointDir": "/ckpt/"}}
    env = env_of(container_of(worker(spec, index=1, attempt=3)))
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/ckpt/flight-recorder/attempt-3-rank-"
    relative = env_of(container_of(worker({"nodes": 2, "trainer": {"checkpointDir": "ck"}})))
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in relative  # the working dir is the image's


S3_JOB = {
    "nodes": 2,
    "trainer": {"checkpointDir": "s3://checkpoints/mnist"},
    "checkpointStore": {"secretName": "s3-credentials"},
}


def test_a_checkpoint_store_gives_every_worker_the_aws_variables_from_its_secret() -> None:
    for index in (0, 1):
        pod = worker(S3_JOB, index=index)
        store = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in container_of(pod)["env"]
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        assert store == {
            "AWS_ACCESS_KEY_ID": {"name": "s3-credentials", "key": "AWS_ACCESS_KEY_ID"},
            "AWS_SECRET_ACCESS_KEY": {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"},
            **{
                key: {"name": "s3-credentials", "key": key, "optional": True}
                for key in ("AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL")
            },
        }
    # No volume for an object store, and no flight-recorder path under an s3:// URI.
    pod = worker(S3_JOB)
    assert "ddp-checkpoints" not in {v["name"] for v in pod["spec"].get("volumes", [])}
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env_of(container_of(pod))


def test_a_variable_the_jobs_env_sets_is_left_to_it_not_taken_from_the_secret() -> None:
    endpoint = {"name": "AWS_ENDPOINT_URL", "value": "http://minio.storage:9000"}
    env = container_of(worker({**S3_JOB, "env": [endpoint]}))["env"]
    assert [e for e in env if e["name"] == "AWS_ENDPOINT_URL"] == [endpoint]
    assert not any("AWS_" in e["name"] for e in container_of(worker({"nodes": 2}))["env"])


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Pod":
        return list(obj["spec"]["containers"])
    if obj["kind"] == "MPIJob":
        replicas = obj["spec"]["mpiReplicaSpecs"].values()
        return [c for r in replicas for c in r["template"]["spec"]["containers"]]
    return []


def test_a_failed_workers_last_log_lines_become_its_message() -> None:
    """The kubelet copies a failed container's last log lines into its terminated state's
    message, which status.failure and the job's Event then carry."""
    pod = worker(GPU_2X8)
    mpi = build_mpijob(make_job(nodes=2, launcher="mpi"), 0, SETTINGS)
    launcher = mpi["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    for container in (container_of(pod), launcher):
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_mpi_launcher_gets_the_templates_placement_but_not_the_data() -> None:
    """mpirun needs the image's environment (volumes, placement, security) but no accelerator,
    and no claim: a ReadWriteOnce one could not follow the launcher to another node."""
    template = {
        "nodeSelector": {"pool": "gaudi"},
        "securityContext": {"runAsUser": 0},
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "cifar10"}},
            {"name": "tools", "hostPath": {"path": "/opt/tools"}},
        ],
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "tools", "mountPath": "/opt/tools"},
        ],
    }
    obj = mpijob({**GAUDI_2X8, "template": template})
    launcher = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert launcher["nodeSelector"] == {"pool": "gaudi"}
    assert launcher["securityContext"]["runAsUser"] == 0
    assert [v["name"] for v in launcher["volumes"]] == ["tools"]
    (container,) = launcher["containers"]
    assert container["volumeMounts"] == [{"name": "tools", "mountPath": "/opt/tools"}]
    assert container["resources"] == {"requests": LAUNCHER_REQUESTS}  # no device
    assert "hostIPC" not in launcher and "tolerations" not in launcher
    worker_pod = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {v["name"] for v in worker_pod["volumes"]} == {"data", "tools", "dshm", "kube-ddp-token"}


def test_the_mpi_workers_get_the_writable_dirs_and_the_launcher_does_not() -> None:
    obj = mpijob({**GAUDI_2X8, "trainer": {"dataset": "cifar10", "dataDir": "/data"}})
    replicas = obj["spec"]["mpiReplicaSpecs"]
    worker_pod = replicas["Worker"]["template"]["spec"]
    launcher = replicas["Launcher"]["template"]["spec"]
    assert "ddp-data" in {v["name"] for v in worker_pod["volumes"]}
    assert {"name": "ddp-data", "mountPath": "/data"} in worker_pod["containers"][0]["volumeMounts"]
    assert launcher["volumes"] == []
    assert "volumeMounts" not in launcher["containers"][0]


def test_the_pod_template_fields_users_know_reach_the_worker() -> None:
    sidecar = {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}
    template = {
        "imagePullSecrets": [{"name": "registry"}],
        "initContainers": [{"name": "fetch", "image": "busybox"}, sidecar],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        ],
        "runtimeClassName": "nvidia",
        "terminationGracePeriodSeconds": 60,
        "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["store"]}],
        "container": {
            "envFrom": [{"secretRef": {"name": "wandb"}}],
            "securityContext": {"readOnlyRootFilesystem": True},
            "workingDir": "/app",
            "readinessProbe": {"exec": {"command": ["true"]}},
        },
    }
    pod = worker({"nodes": 2, "template": template})
    spec, container = pod["spec"], container_of(pod)
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch", "proxy"]
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    assert (spec["runtimeClassName"], spec["terminationGracePeriodSeconds"]) == ("nvidia", 60)
    assert spec["hostAliases"][0]["hostnames"] == ["store"]
    assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert container["securityContext"] == {
        **RESTRICTED_CONTAINER_CONTEXT,
        "readOnlyRootFilesystem": True,
    }
    assert container["workingDir"] == "/app"
    assert container["readinessProbe"] == {"exec": {"command": ["true"]}}


def test_gaudi_adds_sys_nice_to_the_users_container_security_context() -> None:
    context = {"runAsNonRoot": True, "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]}}
    pod = worker({**GAUDI_2X8, "template": {"container": {"securityContext": context}}})
    assert container_of(pod)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "capabilities": {"add": ["IPC_LOCK", "SYS_NICE"], "drop": ["ALL"]},
    }


def test_the_mpi_launcher_gets_pull_secrets_and_container_settings_but_no_init() -> None:
    template = {
        "imagePullSecrets": [{"name": "registry"}],
        "initContainers": [{"name": "fetch", "image": "busybox"}],
        "container": {"envFrom": [{"configMapRef": {"name": "c"}}], "livenessProbe": {}},
    }
    obj = mpijob({**GAUDI_2X8, "template": template})
    launcher = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    worker_pod = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert launcher["imagePullSecrets"] == [{"name": "registry"}]
    assert "initContainers" not in launcher and worker_pod["initContainers"]
    assert launcher["containers"][0]["envFrom"] == [{"configMapRef": {"name": "c"}}]
    assert "livenessProbe" not in launcher["containers"][0]


def test_mpi_pods_get_no_default_fsgroup_that_would_open_the_ssh_key() -> None:
    """An fsGroup makes the MPI Operator's ssh key Secret group-readable (0440), which ssh and
    sshd refuse as a private key: launcher mpi pods keep only what the template sets."""
    mpi = {"socketsPerNode": 1, "coresPerProcess": 1}
    mpijob = build_mpijob(make_job(nodes=2, launcher="mpi", mpi=mpi), 0, SETTINGS)
    for replica in mpijob["spec"]["mpiReplicaSpecs"].values():
        assert "fsGroup" not in replica["template"]["spec"].get("securityContext", {})


def test_agents_may_restart_in_place_what_backoff_limit_has_left() -> None:
    """The agent's own bound on restarts in place: backoffLimit less the restarts counted when
    the pod is created (the operator enforces the limit; this keeps an agent from going on)."""
    job = make_job(nodes=2, runPolicy={"backoffLimit": 4})
    job = job.model_copy(update={"status": JobStatus(restarts=3)})
    (pod,) = [c for c in build_children(job, 1, SETTINGS, [1]) if c["kind"] == "Pod"]
    assert "--max-restarts=1" in container_of(pod)["command"]
    spent = job.model_copy(update={"status": JobStatus(restarts=4)})
    (pod,) = [c for c in build_children(spent, 1, SETTINGS, [1]) if c["kind"] == "Pod"]
    assert "--max-restarts=0" in container_of(pod)["command"]


def test_only_jobs_whose_image_holds_the_agent_restart_in_place() -> None:
    assert make_job(nodes=2).spec.restarts_in_place
    assert make_job(nodes=2, command=["python", "train.py"]).spec.restarts_in_place
    assert not make_job(nodes=2, **RECREATE).spec.restarts_in_place
    assert not make_job(nodes=2, launcher="mpi").spec.restarts_in_place
    own_image = make_job(nodes=2, image="me/train:2", command=["python", "train.py"])
    assert not own_image.spec.restarts_in_place
    assert container_of(build_worker_pod(own_image, 1, 0, SETTINGS))["command"][0] == "python"
    # A command that starts its own launcher runs as written: no agent of ours is in front of it.
    own_launcher = make_job(nodes=2, command=["torchrun", "--nnodes=2", "train.py"])
    assert not own_launcher.spec.restarts_in_place
    assert container_of(build_worker_pod(own_launcher, 1, 0, SETTINGS))["command"][0] == "torchrun"


def test_pods_after_a_node_fault_prefer_other_nodes_beside_the_templates_affinity() -> None:
    own = {"preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}}
    template = {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, **own}]
            }
        }
    }
    made = make_job(nodes=2, template=template)
    pod = build_worker_pod(made, 1, 0, SETTINGS, avoid_nodes=("n7", "n1"))
    validate_strict(pod)
    preferred = pod["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred == [
        {"weight": 10, **own},
        {
            "weight": 100,
            "preference": {
                "matchFields": [
                    {"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n7"]}
                ]
            },
        },
    ]
    assert (
        len(
            made.spec.template.affinity["nodeAffinity"][
                "preferredDuringSchedulingIgnoredDuringExecution"
            ]
        )
        == 1
    )  # the template is left as it was
    assert "affinity" not in worker({"nodes": 1})["spec"]


def test_the_token_is_in_the_worker_container_only() -> None:
    """Kubernetes' automount would put the account's token in every container (init
    containers, sidecars): the workers mount a short-lived one in the container that
    reports, and the MPI launcher none."""
    template = {"initContainers": [{"name": "fetch", "image": "busybox"}]}
    pod = worker({"nodes": 2, "template": template})["spec"]
    assert pod["automountServiceAccountToken"] is False
    (token,) = [v for v in pod["volumes"] if v["name"] == "kube-ddp-token"]
    sources = token["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
    assert _mounts({"spec": pod})[TOKEN_DIR] == "kube-ddp-token"
    (init,) = pod["initContainers"]
    assert "volumeMounts" not in init
    mpijob = build_mpijob(make_job(nodes=2, launcher="mpi"), 0, BuildSettings())
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert launcher["automountServiceAccountToken"] is False
    assert "kube-ddp-token" not in {v["name"] for v in launcher["volumes"]}
    workers = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "kube-ddp-token" in {v["name"] for v in workers["volumes"]}


def _largest(model: type[BaseModel]) -> dict[str, Any]:
    """Each of `model`'s numbers at the largest value its schema allows."""
    return {
        field.alias or name: bound.le
        for name, field in model.model_fields.items()
        for bound in field.metadata
        if isinstance(bound, annotated_types.Le)
    }


def test_a_job_at_every_bound_builds_and_decides() -> None:
    """Every number a job may set, at its largest (a grace period, a gang's timeout, torchrun's
    restarts, each trainer option): its children build, valid for Kubernetes, its status
    decides, and the trainer reads back the flags it is given."""
    trainer = _largest(TrainerOptions)
    at_most = make_job(
        nodes=MAX_NODES,
        accelerator={"type": "nvidia", "perNode": 64},
        port=MIN_PORT,
        trainer=trainer,
        elastic={"minNodes": 1, "maxNodes": MAX_NODES, "maxRestarts": MAX_COUNT},
        template={"terminationGracePeriodSeconds": MAX_SECONDS},
        scheduling={"gang": {"scheduler": "coscheduling", "scheduleTimeoutSeconds": MAX_SECONDS}},
        runPolicy={"backoffLimit": MAX_PORT - MIN_PORT, "activeDeadlineSeconds": MAX_SECONDS},
    )
    children = build_children(at_most, settings=SETTINGS)
    for child in children[:3]:
        validate_strict(child)
    assert sum(c["kind"] == "Pod" for c in children) == MAX_NODES
    assert decide(at_most, [], NOW).actions
    options = TrainerOptions.model_validate(trainer)
    assert parse_argv(to_argv(options)) == options


def test_an_mpi_job_that_runs_as_root_gets_its_keys_in_roots_home() -> None:
    """Intel's Gaudi image as it is runs as root: mpirun's ssh and the workers' sshd must look
    in /root/.ssh, unless sshAuthMountPath says otherwise."""
    as_root = {**GAUDI_2X8, "template": {"securityContext": {"runAsUser": 0}}}
    for spec, keys in [
        (GAUDI_2X8, "/home/trainer/.ssh"),
        (as_root, "/root/.ssh"),
        ({**as_root, "mpi": {"sshAuthMountPath": "/keys"}}, "/keys"),
    ]:
        obj = mpijob(spec)
        assert obj["spec"]["sshAuthMountPath"] == keys
        words = launcher_script(obj)
        assert f"-i {keys}/id_rsa" in words[words.index("plm_rsh_args") + 1]
        (worker,) = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        assert f"HostKey {keys}/id_rsa" in worker["command"][2]
