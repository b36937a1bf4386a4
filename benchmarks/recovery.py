"""Recovery: how long a training job takes to train again after a fault, and the worker-seconds
the fault cost, for kube-ddp (group restart `Recreate`, restart in place `InPlace`), the
Training Operator v1.9.4's PyTorchJob with its own restart policies, and Kubeflow Trainer
v2.3.0's TrainJob (on JobSet v0.12.0) with its defaults.

Real pods on the dev cluster's real node (hack/devcluster; the pods run the e2e tier's
`localhost/hostusr:local` image with this repository mounted: tests/e2e/platform.py), the same
trainer for every contender: the digits MLP on 2 CPU workers (gloo), checkpoints every second
on a directory of the node, rank 0 appending a line per step to its batch log
(`DDP_TRAINER_BATCH_LOG`) in that directory. The controllers run out of the cluster, each in a
namespace of its own.

Faults, each on a fresh job once it has trained a few seconds:
  crash     SIGKILL to worker 1's rank process, from the node (an OOM kill, a segfault)
  delete    `kubectl delete pod` of worker 1 (grace period: the pod's)
  elastic   the same to worker 2 of a 3-worker elastic job (2 to 3 workers)

Back to training (one definition for every contender): the first step rank 0 logs once the rank
0 process of the fault's time is gone (or, should it survive, once its step goes back: a
resume). Steps redone: the step logged at the fault minus the step resumed from (the first step
back, less one). Worker-seconds lost: the job's workers x (the seconds to train again + the
steps redone x the step time seen before the fault).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kubernetes

from benchmarks.contenders import CONTENDERS, JOBSET_NAME_LABEL, OUT
from benchmarks.markdown import Section, raw_note, write_section
from benchmarks.operator_measure import apply_our_crd
from benchmarks.trainer import cpu_count, cpu_description
from ddp_trainer.contract import HEARTBEAT_ENV
from ddp_trainer.options import TrainerOptions, to_argv
from kube_ddp import names
from tests.cluster.support import REPO, Cluster, fresh_namespace, load_dev_cluster
from tests.e2e.platform import DevPlatform, container_pid, dev_job_overrides, dev_mounts

DOCUMENT = REPO / "docs" / "BENCHMARKS.md"
PLOT = DOCUMENT.parent / "benchmarks-recovery.png"
RESULTS = OUT / "recovery.json"
SECTION = "recovery"
TRAINER = {
    "dataset": "digits",
    "model": "mlp",
    "batchSize": 32,
    "device": "cpu",
    "epochs": 100000,  # the job never ends by itself
    "checkpointDir": "/checkpoints",
    "checkpointEverySeconds": 1,  # little to redo: the work lost is the restart's
    "timeoutSeconds": 60,
}
HEARTBEAT_S = "1"  # rank 0's progress report to status.training: at most a second apart
CHECKPOINTS = "/checkpoints"
BATCH_LOG = f"{CHECKPOINTS}/steps"  # rank 0 writes steps.rank0
WORKERS = 2
ELASTIC = (2, 3)  # minNodes, maxNodes: the elastic job starts with the most
WARM_S, QUICK_WARM_S = 6.0, 3.0  # trained before the fault: a checkpoint or more
TRAIN_TIMEOUT_S = 300  # from the create to rank 0's first step: pods import torch on 2 cores
BACK_TIMEOUT_S, QUICK_BACK_TIMEOUT_S = 120, 60
POLL_S = 0.02
STATUS_EVERY_S = 0.25
GONE_TIMEOUT_S = 90
PEER_PORT = 23456  # the Training Operator's default pytorchjob-port
BACKOFF = 100  # restarts allowed: never the limit here

FAULTS = {
    "crash": "rank SIGKILLed (worker 1)",
    "delete": "pod deleted (worker 1)",
    "elastic": f"elastic {ELASTIC[0]}:{ELASTIC[1]} job, worker 2's pod deleted",
}


@dataclass(frozen=True)
class Contestant:
    """A controller and the job it runs for a fault."""

    key: str
    title: str
    controller: str  # the key of benchmarks.contenders that runs its jobs

    # The faults whose job it can run, and what it lacks for the others (the report says it).
    faults: tuple[str, ...] = tuple(FAULTS)
    lacks: str = ""

    def manifest(self, platform: DevPlatform, name: str, namespace: str, fault: str) -> Any:
        raise NotImplementedError

    def pod(self, name: str, index: int, fault: str) -> str:
        """The pod of worker `index` (0: the one whose rank 0 starts first)."""
        raise NotImplementedError

    def find_pod(self, core: Any, namespace: str, name: str, index: int, fault: str) -> str:
        """The pod of worker `index` now (a controller that names its pods at random: found)."""
        return self.pod(name, index, fault)

    def restarts(self, job: dict[str, Any]) -> int | None:
        """The restarts the controller counted on the job (None: it says none)."""
        return None

    def failed(self, job: dict[str, Any]) -> bool:
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Failed" and c["status"] == "True" for c in conditions)


@dataclass(frozen=True)
class KubeDDPJob(Contestant):
    strategy: str = "InPlace"

    def manifest(self, platform: DevPlatform, name: str, namespace: str, fault: str) -> Any:
        spec: dict[str, Any] = {
            "nodes": ELASTIC[1] if fault == "elastic" else WORKERS,
            "trainer": TRAINER,
            "env": _trainer_env(),
            "runPolicy": {"restartStrategy": self.strategy, "backoffLimit": BACKOFF},
            "template": _checkpoints(platform, name, namespace),
        }
        if fault == "elastic":
            spec["elastic"] = {"minNodes": ELASTIC[0], "maxNodes": ELASTIC[1]}
        return {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "metadata": {"name": name},
            "spec": platform.job_spec(spec),
        }

    def pod(self, name: str, index: int, fault: str) -> str:
        return names.worker_name(name, index)

    def restarts(self, job: dict[str, Any]) -> int | None:
        return int((job.get("status") or {}).get("restarts", 0))

    def failed(self, job: dict[str, Any]) -> bool:
        return (job.get("status") or {}).get("phase") == "Failed"


@dataclass(frozen=True)
class PyTorchJob(Contestant):
    policy: str = "OnFailure"

    def manifest(self, platform: DevPlatform, name: str, namespace: str, fault: str) -> Any:
        overrides = platform.job_overrides
        mounts = _checkpoints(platform, name, namespace)
        argv = to_argv(TrainerOptions.model_validate(TRAINER))
        elastic = fault == "elastic"
        # The elastic job's pods start torchrun, which reads the PET_* variables the operator
        # sets; the others run the trainer itself, as kube-ddp's one-process pods do.
        launcher = ["-m", "torch.distributed.run", "-m"] if elastic else ["-m"]
        container = {
            "name": "pytorch",  # the name its webhook and env injection look for
            "image": overrides["image"],
            "imagePullPolicy": overrides["imagePullPolicy"],
            "command": ["python", *launcher, "ddp_trainer", *argv, "--no-report-progress"],
            "env": [*overrides["env"], *_trainer_env()],
            "volumeMounts": overrides["template"]["volumeMounts"] + mounts["volumeMounts"],
            "ports": [{"name": "pytorchjob-port", "containerPort": PEER_PORT}],
        }
        template = {
            "spec": {
                "containers": [container],
                "nodeSelector": overrides["template"]["nodeSelector"],
                "tolerations": overrides["template"]["tolerations"],
                "volumes": overrides["template"]["volumes"] + mounts["volumes"],
            }
        }
        replica = {"restartPolicy": self.policy, "template": template}
        spec: dict[str, Any] = {"nprocPerNode": "1", "runPolicy": {"backoffLimit": BACKOFF}}
        if elastic:
            spec["pytorchReplicaSpecs"] = {"Worker": {**replica, "replicas": ELASTIC[1]}}
            spec["elasticPolicy"] = {
                "minReplicas": ELASTIC[0],
                "maxReplicas": ELASTIC[1],
                "rdzvBackend": "c10d",
                "maxRestarts": BACKOFF,
            }
        else:
            spec["pytorchReplicaSpecs"] = {
                "Master": {**replica, "replicas": 1},
                "Worker": {**replica, "replicas": WORKERS - 1},
            }
        peer = CONTENDERS[self.controller]
        return {
            "apiVersion": f"{peer.group}/{peer.version}",
            "kind": peer.kind,
            "metadata": {"name": name},
            "spec": spec,
        }

    def pod(self, name: str, index: int, fault: str) -> str:
        if fault == "elastic":
            return f"{name}-worker-{index}"
        return f"{name}-master-0" if index == 0 else f"{name}-worker-{index - 1}"


TRAINER_V2_NODE = "node"  # the torch runtime's replicated Job and container (trainer-v2)
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class TrainJob(Contestant):
    """Kubeflow Trainer v2's TrainJob on the `torch-distributed` runtime, as its docs start: no
    restart setting of its own. JobSet's webhook gives the pods `restartPolicy: OnFailure` (the
    kubelet restarts a failed container in its pod), the batch Job keeps its default
    `backoffLimit` (6), a pod deleted is created again by the Job controller (a new name), and
    the JobSet, without a failure policy, fails on a Job's failure."""

    faults: tuple[str, ...] = ("crash", "delete")
    lacks: str = "no elastic policy (Trainer v2 removed it in v2.2)"

    def manifest(self, platform: DevPlatform, name: str, namespace: str, fault: str) -> Any:
        overrides = platform.job_overrides
        mounts = _checkpoints(platform, name, namespace)
        argv = to_argv(TrainerOptions.model_validate(TRAINER))
        pod_spec = {
            "nodeSelector": overrides["template"]["nodeSelector"],
            "tolerations": overrides["template"]["tolerations"],
            "volumes": overrides["template"]["volumes"] + mounts["volumes"],
            "containers": [
                {
                    "name": TRAINER_V2_NODE,
                    "volumeMounts": overrides["template"]["volumeMounts"] + mounts["volumeMounts"],
                }
            ],
        }
        node = {"name": TRAINER_V2_NODE, "template": {"spec": {"template": {"spec": pod_spec}}}}
        peer = CONTENDERS[self.controller]
        return {
            "apiVersion": f"{peer.group}/{peer.version}",
            "kind": peer.kind,
            "metadata": {"name": name},
            "spec": {
                "runtimeRef": {"name": load_dev_cluster().kubeflow_trainer.RUNTIME},
                "trainer": {
                    "numNodes": WORKERS,
                    "numProcPerNode": 1,  # "auto" is a process per CPU
                    "image": overrides["image"],
                    # torchrun reads the PET_* variables the Trainer sets
                    "command": ["python", "-m", "torch.distributed.run", "-m", "ddp_trainer"],
                    "args": [*argv, "--no-report-progress"],
                    "env": [*overrides["env"], *_trainer_env()],
                },
                "runtimePatches": [
                    {
                        "manager": "kube-ddp.io/bench",
                        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}},
                    }
                ],
            },
        }

    def find_pod(self, core: Any, namespace: str, name: str, index: int, fault: str) -> str:
        selector = f"{JOBSET_NAME_LABEL}={name},{JOB_INDEX_LABEL}={index}"
        pods = [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")
        ]
        if not pods:
            raise RuntimeError(f"no pod of {name}'s node {index}")
        return str(max(pods, key=lambda p: p.metadata.creation_timestamp).metadata.name)


CONTESTANTS: dict[str, Contestant] = {
    c.key: c
    for c in (
        KubeDDPJob("recreate", "kube-ddp, Recreate (before)", "kube-ddp", strategy="Recreate"),
        KubeDDPJob("inplace", "kube-ddp, InPlace", "kube-ddp", strategy="InPlace"),
        PyTorchJob("onfailure", "PyTorchJob, OnFailure", "training-operator", policy="OnFailure"),
        PyTorchJob("exitcode", "PyTorchJob, ExitCode", "training-operator", policy="ExitCode"),
        TrainJob("trainjob", "TrainJob (Trainer v2), defaults", "trainer-v2"),
    )
}


def _trainer_env() -> list[dict[str, str]]:
    return [
        {"name": HEARTBEAT_ENV, "value": HEARTBEAT_S},
        {"name": "DDP_TRAINER_BATCH_LOG", "value": BATCH_LOG},
    ]


def _checkpoints(platform: DevPlatform, name: str, namespace: str) -> dict[str, Any]:
    """A directory of the node that outlives the job's pods: checkpoints and the batch log."""
    volume = {**platform.scratch_volume(name, namespace), "name": "checkpoints"}
    return {
        "volumes": [volume],
        "volumeMounts": [{"name": "checkpoints", "mountPath": CHECKPOINTS}],
    }


def batch_log(platform: DevPlatform, name: str, namespace: str) -> Path:
    return Path(platform.scratch_volume(name, namespace)["hostPath"]["path"]) / "steps.rank0"


# The Training Operator gives a PyTorchJob's Worker pods an init container that waits for the
# master's DNS name (an nslookup loop in alpine:3.10, which no registry serves here): the same
# wait, in Python on the image the workers run, through its --pytorch-init-container-template-file
# (Go template fields .InitContainerImage and .MasterAddr).
WAIT_FOR_MASTER = """import socket, sys, time
for _ in range(100):
    try:
        socket.gethostbyname("{{.MasterAddr}}")
        sys.exit(0)
    except OSError:
        print("waiting for master", flush=True)
        time.sleep(2)
sys.exit(1)"""


def init_container_template(platform: DevPlatform) -> str:
    overrides = platform.job_overrides
    container = {
        "name": "init-pytorch",
        "image": overrides["image"],
        "imagePullPolicy": overrides["imagePullPolicy"],
        "command": ["python", "-c", WAIT_FOR_MASTER],
        "env": overrides["env"],
        "volumeMounts": overrides["template"]["volumeMounts"],
    }
    return json.dumps([container])  # YAML, as the operator reads it


@contextmanager
def running(
    controller: str, platform: DevPlatform, namespace: str, scratch: Path
) -> Iterator[None]:
    """The controller of `controller` (a key of benchmarks.contenders) on `namespace`."""
    kubeconfig = platform.cluster.kubeconfig
    if controller != "training-operator":
        with CONTENDERS[controller].run(str(kubeconfig), namespace, scratch):
            yield
        return
    template = scratch / "init-container.yaml"  # not under /tmp: the operator gets its own
    template.write_text(init_container_template(platform))
    flag = f"--pytorch-init-container-template-file={template}"
    with load_dev_cluster().peers.training_operator(kubeconfig, namespace, scratch, [flag]):
        yield


# --- the processes of a pod, from the node ---------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def rank_processes(root: int) -> list[int]:
    """The trainer's rank processes at or below `root`: the children of a launcher (torchrun;
    kube-ddp's forks its first ranks from itself: their command line is its own), or a
    trainer process that is no launcher."""
    ranks, todo = [], [(root, False)]
    while todo:
        pid, under_launcher = todo.pop()
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        launcher = b"torchrun" in command or b"distributed.run" in command
        if under_launcher or (b"ddp_trainer" in command and not launcher):
            ranks.append(pid)
            continue
        todo += [(child, launcher) for child in _children(pid)]
    return ranks


def _writes(pid: int, path: str) -> bool:
    """Whether process `pid` has `path` (in its own mount namespace) open: the rank that writes
    rank 0's batch log, whichever launcher started it."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) == path:
                return True
    return False


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- one run ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    contender: str
    fault: str
    workers: int
    back_s: float | None = None  # fault -> rank 0's first step back
    restart_s: float | None = None  # fault -> the controller counted a restart
    reached: int = 0  # the step rank 0 had logged at the fault
    resumed: int | None = None
    step_s: float = 0.0
    error: str = ""

    @property
    def redone(self) -> int | None:
        return None if self.resumed is None else max(0, self.reached - self.resumed)

    @property
    def worker_seconds(self) -> float | None:
        if self.back_s is None or self.redone is None:
            return None
        return self.workers * (self.back_s + self.redone * self.step_s)


class StepLog:
    """Rank 0's batch log as it grows: (when a line was seen, its step)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: list[tuple[float, int]] = []

    def read(self) -> list[tuple[float, int]]:
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line half written is read next time
        self.offset += len(complete)
        now = time.monotonic()
        new = [(now, int(json.loads(line)["step"])) for line in complete.splitlines() if line]
        self.seen += new
        return new


class Bench:
    def __init__(self, platform: DevPlatform, namespaces: dict[str, str], quick: bool) -> None:
        self.platform = platform
        self.cluster = platform.cluster
        self.namespaces = namespaces  # controller key -> its namespace
        self.quick = quick

    def run(self, contender: Contestant, fault: str) -> Outcome:
        namespace = self.namespaces[contender.controller]
        name = f"{contender.key[:4]}-{fault[:4]}-{uuid.uuid4().hex[:5]}"
        workers = ELASTIC[1] if fault == "elastic" else WORKERS
        outcome = Outcome(contender.key, fault, workers)
        self._create(contender, namespace, name, fault)
        try:
            self._measure(contender, namespace, name, fault, outcome)
        except (RuntimeError, TimeoutError) as error:
            outcome.error = str(error).splitlines()[0]
        finally:
            self._delete(contender, namespace, name)
        return outcome

    def _measure(
        self, contender: Contestant, namespace: str, name: str, fault: str, outcome: Outcome
    ) -> None:
        steps = StepLog(batch_log(self.platform, name, namespace))
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        while not steps.seen:
            steps.read()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no step in {TRAIN_TIMEOUT_S} s: {self._pods(namespace, name)}")
            time.sleep(0.2)
        warm = QUICK_WARM_S if self.quick else WARM_S
        until = steps.seen[0][0] + warm
        while time.monotonic() < until:
            steps.read()
            time.sleep(POLL_S)
        restarts_before = contender.restarts(self._job(contender, namespace, name))
        first_at, first = steps.seen[0]
        rank0 = self._rank0(contender, namespace, name, fault)
        victim = contender.find_pod(
            self.cluster.core, namespace, name, ELASTIC[1] - 1 if fault == "elastic" else 1, fault
        )
        steps.read()
        last_at, outcome.reached = steps.seen[-1]
        outcome.step_s = (last_at - first_at) / max(1, outcome.reached - first)
        fault_at = self._inject(namespace, victim, fault)
        steps.read()
        previous = steps.seen[-1][1]
        gone = False
        timeout = QUICK_BACK_TIMEOUT_S if self.quick else BACK_TIMEOUT_S
        status_at = 0.0
        while outcome.back_s is None:
            now = time.monotonic()
            if now - fault_at > timeout:
                raise TimeoutError(f"not training again {timeout} s after the fault: "
                                   f"{self._pods(namespace, name)}")  # fmt: skip
            if now > status_at:
                status_at = now + STATUS_EVERY_S
                job = self._job(contender, namespace, name)
                counted = contender.restarts(job)
                if (
                    outcome.restart_s is None
                    and counted is not None
                    and counted > (restarts_before or 0)
                ):
                    outcome.restart_s = time.monotonic() - fault_at
                if contender.failed(job):
                    raise RuntimeError(f"the job Failed: {self._pods(namespace, name)}")
            # Checked before the read: what is read once it is gone was written before it went,
            # and the next line is the new run's (a rank 0 that survives: a step that goes back).
            was_gone = gone
            gone = gone or not alive(rank0)
            for seen_at, step in steps.read():
                if was_gone or step <= previous:
                    outcome.back_s = seen_at - fault_at
                    outcome.resumed = step - 1
                    break
                previous = step
            time.sleep(POLL_S)

    def _rank0(self, contender: Contestant, namespace: str, name: str, fault: str) -> int:
        """The process of global rank 0 now, on the node: the one writing rank 0's batch log."""
        workers = ELASTIC[1] if fault == "elastic" else WORKERS
        for index in range(workers):
            found = contender.find_pod(self.cluster.core, namespace, name, index, fault)
            pod = self.cluster.core.read_namespaced_pod(found, namespace)
            for pid in rank_processes(container_pid(pod)):
                if _writes(pid, f"{BATCH_LOG}.rank0"):
                    return pid
        raise RuntimeError(f"no process of rank 0 in {name}'s pods")

    def _inject(self, namespace: str, victim: str, fault: str) -> float:
        if fault == "crash":
            pod = self.cluster.core.read_namespaced_pod(victim, namespace)
            ranks = rank_processes(container_pid(pod))
            if not ranks:
                raise RuntimeError(f"no rank process in {victim}")
            at = time.monotonic()
            os.kill(ranks[0], signal.SIGKILL)
            return at
        at = time.monotonic()
        self.cluster.core.delete_namespaced_pod(victim, namespace)
        return at

    def _create(self, contender: Contestant, namespace: str, name: str, fault: str) -> None:
        peer = CONTENDERS[contender.controller]
        manifest = contender.manifest(self.platform, name, namespace, fault)
        self.cluster.custom_objects.create_namespaced_custom_object(
            peer.group, peer.version, namespace, peer.plural, manifest
        )

    def _job(self, contender: Contestant, namespace: str, name: str) -> dict[str, Any]:
        peer = CONTENDERS[contender.controller]
        job: dict[str, Any] = self.cluster.custom_objects.get_namespaced_custom_object(
            peer.group, peer.version, namespace, peer.plural, name
        )
        return job

    def _pods(self, namespace: str, name: str) -> str:
        pods = self.cluster.core.list_namespaced_pod(namespace).items
        said = []
        for pod in pods:
            if pod.metadata.name.startswith(name):
                statuses = pod.status.container_statuses or []
                restarts = sum(s.restart_count for s in statuses)
                ended = [s.state.terminated.exit_code for s in statuses if s.state.terminated]
                exits = f" exit {ended[0]}" if ended else ""
                said.append(f"{pod.metadata.name[len(name) + 1 :]} {pod.status.phase}{exits}, "
                            f"{restarts} restarts")  # fmt: skip
        return "; ".join(said) or "no pods"

    def _delete(self, contender: Contestant, namespace: str, name: str) -> None:
        """The job and its pods gone (at once: no grace), so the next run has the cores."""
        peer = CONTENDERS[contender.controller]
        core = self.cluster.core
        try:
            self.cluster.custom_objects.delete_namespaced_custom_object(
                peer.group, peer.version, namespace, peer.plural, name
            )
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while time.monotonic() < deadline:
            left = [p for p in core.list_namespaced_pod(namespace).items
                    if p.metadata.name.startswith(name)]  # fmt: skip
            if not left:
                return
            for pod in left:
                try:
                    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
                except kubernetes.client.ApiException as error:
                    if error.status != 404:
                        raise
            time.sleep(1)
        raise RuntimeError(f"{name}'s pods still there {GONE_TIMEOUT_S} s after its deletion")


# --- the stage ---------------------------------------------------------------------------------


@contextmanager
def real_node() -> Iterator[DevPlatform]:
    """The dev cluster and its real node (waiting for another clone's node: one per machine),
    kube-ddp's CRD applied; stopped after if this started them."""
    dev_cluster = load_dev_cluster()
    started_here = dev_cluster.running_state() is None
    state = dev_cluster.up(owner="bench")
    try:
        kubeconfig = Path(state["kubeconfig"])
        apply_our_crd(kubeconfig)
        dev_cluster.node.up()
        cluster = Cluster.of_dev_cluster(state)
        try:
            yield DevPlatform(cluster, Path("helm"), dev_job_overrides(), [], dev_mounts())
        finally:
            cluster.api.close()
    finally:
        if started_here:
            dev_cluster.down()


def measure(
    repeats: int, faults: list[str], contestants: list[Contestant], quick: bool
) -> dict[str, Any]:
    """`repeats` runs of every (fault, contender) cell, interleaved; the outcomes and the
    machine's load."""
    results: dict[str, Any] = {
        "repeats": repeats,
        "faults": faults,
        "contenders": {c.key: c.title for c in contestants},
        "load": [],
        "outcomes": [],
    }
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    scratch = OUT / "recovery"
    scratch.mkdir(exist_ok=True)
    with real_node() as platform, ExitStack() as stack:
        namespaces = {}
        for controller in {c.controller for c in contestants}:
            namespace = stack.enter_context(
                fresh_namespace(platform.cluster, f"bench-recovery-{uuid.uuid4().hex[:5]}")
            )
            stack.enter_context(running(controller, platform, namespace, scratch))
            namespaces[controller] = namespace
        bench = Bench(platform, namespaces, quick)
        for repeat in range(repeats):
            for fault in faults:
                for contender in contestants:
                    if fault not in contender.faults:
                        continue
                    load = os.getloadavg()[0]
                    results["load"].append(load)
                    outcome = bench.run(contender, fault)
                    results["outcomes"].append(asdict(outcome))
                    said = f"{fault}, {contender.key} (load {load:.1f}): {_said(outcome)}"
                    print(f"recovery [{repeat + 1}/{repeats}] {said}", file=sys.stderr, flush=True)
                    results["minutes"] = (time.monotonic() - started) / 60
                    RESULTS.write_text(json.dumps(results, indent=1))
    return results


def _said(outcome: Outcome) -> str:
    if outcome.back_s is None:
        return f"not back: {outcome.error}"
    return (f"back in {outcome.back_s:.1f} s, {outcome.redone} steps redone, "
            f"{outcome.worker_seconds:.1f} worker-s")  # fmt: skip


def run(args: argparse.Namespace) -> Section:
    """`python -m benchmarks recovery`: every contender, every fault."""
    faults = ["crash"] if args.quick else list(FAULTS)
    repeats = 1 if args.quick else args.repeats
    results = measure(repeats, faults, list(CONTESTANTS.values()), args.quick)
    if not args.quick and not args.no_write:
        plot(results)
    return Section(render(results), results)


# --- the report --------------------------------------------------------------------------------


@dataclass
class Cell:
    outcomes: list[dict[str, Any]] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        """`key` of the runs that have it: a field or a property of Outcome."""
        found = [getattr(Outcome(**o), key) for o in self.outcomes]
        return [float(v) for v in found if v is not None]

    def failed(self) -> int:
        return sum(1 for o in self.outcomes if o["back_s"] is None)


def _cells(results: dict[str, Any]) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    for outcome in results["outcomes"]:
        cells.setdefault((outcome["fault"], outcome["contender"]), Cell()).outcomes.append(outcome)
    return cells


def _spread(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    median = f"{statistics.median(values):.{digits}f}"
    if len(values) == 1:
        return median
    return f"{median} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def render(results: dict[str, Any]) -> str:
    cells = _cells(results)
    rows = []
    for fault, fault_title in FAULTS.items():
        for key, contender in CONTESTANTS.items():
            cell = cells.get((fault, key))
            if cell is None:
                said = contender.lacks if fault not in contender.faults else "not in this run"
                rows.append(f"| {fault_title} | {contender.title} | {said} | | | | 0 |")
                continue
            failed = cell.failed()
            back = _spread(cell.values("back_s"))
            if failed:
                first = next(o["error"] for o in cell.outcomes if o["back_s"] is None)
                back += f"; {failed} of {len(cell.outcomes)} not back (first: {first})"
            rows.append(
                f"| {fault_title} | {contender.title} | {back} "
                f"| {_spread(cell.values('restart_s'))} | {_spread(cell.values('redone'), 0)} "
                f"| {_spread(cell.values('worker_seconds'))} | {len(cell.outcomes)} |"
            )
    loads = results["load"]
    cpu_model, _ = cpu_description()
    load = (
        f"{min(loads):.1f} to {max(loads):.1f}, median {statistics.median(loads):.1f}"
        if loads
        else "-"
    )
    return "\n".join(
        [
            "## Recovery after a fault",
            "",
            "Command: `python -m benchmarks recovery` (part of `make bench`; "
            "`python -m benchmarks.recovery --contender KEY --fault FAULT` for some cells, "
            "`--render` to write this section from `.bench/recovery.json`). "
            f"{raw_note(SECTION)}",
            "",
            f"Machine: {cpu_count()} CPUs, {cpu_model}, no GPU; the dev cluster's real node is "
            f"this machine. Load average (1 min) before each run {load}: the machine is "
            f"shared, figures are noisy. The run took {results.get('minutes', 0):.0f} minutes.",
            "",
            "Every contender runs the same trainer on the dev cluster's real node: the digits "
            f"MLP, {WORKERS} CPU workers (gloo), checkpoints every "
            f"{TRAINER['checkpointEverySeconds']} s, progress heartbeat {HEARTBEAT_S} s; a fresh "
            "job per run, faulted after a few seconds of training. Runs interleaved; median "
            "(lowest-highest) of the runs each.",
            "",
            "- Back to training: from the fault to the first step rank 0 logs once the rank 0 "
            "process of the fault's time is gone (its batch log, `DDP_TRAINER_BATCH_LOG`, "
            "read from the node every 20 ms): one definition for every contender.",
            "- Restart counted: from the fault to `status.restarts` growing (kube-ddp only: "
            "the others count none on the job).",
            "- Steps redone: the step rank 0 had logged at the fault minus the step it resumed "
            "from.",
            "- Worker-seconds lost: the job's workers x (back to training + steps redone x the "
            "step time before the fault).",
            "",
            "| fault | contender | back to training (s) | restart counted (s) | steps redone "
            "| worker-seconds lost | runs |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"![recovery]({PLOT.name})",
            "",
            "Goal: a rank crash back to training in at most 10 s, a lost pod in at most 15 s, "
            "and no slower than any peer on any fault.",
            "",
            "How the contenders run. kube-ddp: `kube-ddp operator --namespace=NS` out of the "
            "cluster, the job's `runPolicy.restartStrategy` set, `backoffLimit` "
            f"{BACKOFF}. Training Operator v1.9.4 (hack/devcluster/peers.py), "
            "`--enable-scheme=pytorchjob`: Master 1 + Worker 1, the replicas' `restartPolicy` "
            "set (OnFailure: the kubelet restarts the container in its pod; ExitCode: the "
            "operator recreates the pod when the exit code is 128 or more, fails the job on "
            '1 to 127), `nprocPerNode: "1"`. Its pods run the trainer itself (`python -m '
            "ddp_trainer` with kube-ddp's trainer flags, from the MASTER_ADDR, MASTER_PORT, "
            "RANK and WORLD_SIZE it sets), as kube-ddp's one-process pods do; its elastic job "
            f"is Worker {ELASTIC[1]} with `elasticPolicy` (c10d, min {ELASTIC[0]}, max "
            f"{ELASTIC[1]}) and `python -m torch.distributed.run`, which reads its PET_* "
            "variables. Its Worker pods' init container (an nslookup loop on alpine:3.10, "
            "which no registry serves here) is replaced through "
            "`--pytorch-init-container-template-file` by the same wait in Python on the "
            "workers' image. Kubeflow Trainer v2.3.0 with JobSet v0.12.0 "
            "(hack/devcluster/kubeflow_trainer.py): a TrainJob on its `torch-distributed` "
            f"runtime, `numNodes: {WORKERS}`, `numProcPerNode: 1`, the command `python -m "
            "torch.distributed.run -m ddp_trainer` (torchrun reads the PET_* variables it "
            "sets; static rendezvous at node 0) and the pods put on the real node by "
            "`runtimePatches`; nothing else set: JobSet gives its pods `restartPolicy: "
            "OnFailure`, the batch Job its default `backoffLimit`, and it has no elastic "
            "policy. The victim's rank is the trainer process below the container's main "
            "process (the launcher, where there is one), SIGKILLed from the node.",
        ]
    )


def plot(results: dict[str, Any]) -> None:
    """Back-to-training medians per fault, a bar per contender (lowest-highest as the error)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells(results)
    keys = list(CONTESTANTS)
    colors = {key: f"C{i}" for i, key in enumerate(keys)}  # one color per contender
    figure, axis = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / len(keys)
    for offset, key in enumerate(keys):
        xs, ys, low, high = [], [], [], []
        for position, fault in enumerate(FAULTS):
            cell = cells.get((fault, key))
            values = cell.values("back_s") if cell else []
            if not values:  # not run, or never back (the table says which)
                continue
            median = statistics.median(values)
            xs.append(position + (offset - (len(keys) - 1) / 2) * width)
            ys.append(median)
            low.append(median - min(values))
            high.append(max(values) - median)
        if not xs:
            continue
        axis.bar(xs, ys, width, yerr=[low, high], label=CONTESTANTS[key].title,
                 color=colors[key], capsize=3)  # fmt: skip
    axis.set_xticks(range(len(FAULTS)), [FAULTS[f] for f in FAULTS], fontsize=8)
    axis.set_ylabel("fault -> training again (s)")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(PLOT, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--contender", action="append", choices=list(CONTESTANTS), help="default: all"
    )
    parser.add_argument("--fault", action="append", choices=list(FAULTS), help="default: all")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (median)")
    parser.add_argument("--quick", action="store_true", help="shorter waits, to try the code")
    parser.add_argument("--render", action="store_true",
                        help=f"measure nothing: the section and plot from {RESULTS}")  # fmt: skip
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads(RESULTS.read_text())
    else:
        chosen = [CONTESTANTS[k] for k in args.contender or CONTESTANTS]
        results = measure(args.repeats, args.fault or list(FAULTS), chosen, args.quick)
    section = render(results)
    print(section)
    if not args.no_write and not args.quick:
        plot(results)
        write_section(DOCUMENT, SECTION, Section(section, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
