"""The controllers the operator benchmark compares: kube-ddp and Kubeflow's peers, each with the
job kind it runs, run as a process against the same local control plane.

| contender | job of N workers | its worker pods | the pod whose exit 0 ends it |
| --- | --- | --- | --- |
| kube-ddp | DDPTrainingJob, `nodes: N` | `<job>-worker-<i>` | worker 0 |
| MPI Operator | MPIJob, N workers + a launcher | `<job>-worker-<i>` | the launcher |
| Training Operator | PyTorchJob: Master 1, Worker N-1 | `<job>-master-0`, `-worker-<i>` | master |
| Trainer v2 | TrainJob, `numNodes: N`, runtime `torch-distributed` | `<job>-node-0-<i>-<x>` | all |
| floor | no job: the objects `kube-ddp render` gives for it | `<job>-worker-<i>` | - |

The floor is no controller at all: the benchmark's client creates the objects kube-ddp's
builders render for each job (Service, NetworkPolicy, ServiceAccount, Role, RoleBinding, the
pods) itself, in the operator's two rounds, each round's requests at once, as fast as the API
server takes them. It is the limit on this
machine, and runs only the stages that need no controller (apply, burst).

(The MPI launcher is the pod of a batch Job the MPI Operator creates. A TrainJob makes a JobSet,
which makes one Indexed batch Job whose pods have random suffixes: the benchmark knows them by
their hostname, `<job>-node-0-<i>`. Its JobSet succeeds when every pod has: each one ends it.)

Every job asks for `cleanPodPolicy: Running` (kube-ddp's default), so a lifecycle ends the same
way on each side (a TrainJob has no such setting: its pods stay, Succeeded). The peers' client
rate limits are raised from their defaults (MPI Operator 5 requests/s, Training Operator 20) to
50 requests/s, bursts of 100, and both get 4 reconcile workers: kube-ddp has no client-side
limit and 8 workers. Trainer v2 and JobSet run with their own defaults (Trainer: 50 requests/s,
bursts of 100, 5 TrainJobs at once; JobSet: 500 and 500): hack/devcluster/kubeflow_trainer.py.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

from kube_ddp import names
from kube_ddp.builders import BuildSettings
from kube_ddp.controller import FIRST_ROUND_KINDS
from kube_ddp.jobfile import load_job
from kube_ddp.kube import collection_path
from kube_ddp.launchers import build_children
from tests.cluster.support import load_dev_cluster

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / ".bench"  # results and scratch, git-ignored
IMAGE = "registry.invalid/bench:never-pulled"  # kwok runs no container
PEER_QPS = ("50", "100")  # requests/s and burst, as hack/devcluster/mpioperator.py runs it
PEER_WORKERS = "4"
PEER_QUEUE = ("1000", "2000")  # the MPI Operator's work queue: events/s and burst


@dataclass
class Running:
    """A contender's controller process while it runs."""

    pids: tuple[int, ...]  # its processes: CPU and memory are their sums
    # Jobs it has reconciled since it started (after a restart: the live jobs, once caught up).
    synced: Callable[[], int]


def devcluster_processes() -> Any:
    """hack/devcluster/processes.py: spawning, HTTP checks, commands."""
    load_dev_cluster()
    return importlib.import_module("devcluster.processes")


def _metric_sum(url: str, name: str, labels: str = "") -> float:
    """The sum of a Prometheus metric's samples at `url` (0 when absent) whose labels contain
    `labels`."""
    status, body = devcluster_processes().http_get(url)
    if status != 200:
        return 0.0
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name) and labels in line:
            key, _, value = line.rpartition(" ")
            if key.split("{")[0] == name:
                total += float(value)
    return total


# The stages of benchmarks.operator_measure a controller runs; the floor runs the first two.
STAGES = ("apply", "completion", "burst", "scale")


class Contender:
    key: str
    title: str
    group: str
    version: str
    plural: str
    kind: str
    stages: tuple[str, ...] = STAGES
    lists_finishers = False  # `finishers` lists the job's pods (a request of the client's)

    def create(self, api: Any, namespace: str, name: str, workers: int) -> None:
        """Job `name` of `workers` workers, as its controller's users create it."""
        kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            self.group, self.version, namespace, self.plural, self.manifest(name, workers)
        )

    def manifest(self, name: str, workers: int) -> dict[str, Any]:
        raise NotImplementedError

    def worker_pods(self, name: str, workers: int) -> list[str]:
        raise NotImplementedError

    def finishers(self, core: Any, namespace: str, name: str) -> list[str]:
        """The pods whose exit 0 ends job `name` (its last one ends it)."""
        raise NotImplementedError

    def pod_key(self, pod: Any) -> str:
        """The name `worker_pods` gives a pod of this contender's jobs."""
        return str(pod.metadata.name)

    def pods_per_job(self, workers: int) -> int:
        return workers

    def succeeded(self, job: dict[str, Any]) -> bool:
        return _condition_true(job, "Succeeded")

    def says_running(self, job: dict[str, Any]) -> bool:
        """Whether the job's own status says its workers run (the controller caught up)."""
        return _condition_true(job, "Running")

    def run(
        self, kubeconfig: str, namespace: str, scratch: Path
    ) -> AbstractContextManager[Running]:
        raise NotImplementedError

    def _metadata(self, name: str) -> dict[str, Any]:
        return {"apiVersion": f"{self.group}/{self.version}", "kind": self.kind,
                "metadata": {"name": name}}  # fmt: skip


def _condition_true(job: dict[str, Any], kind: str) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def _container(name: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": name, "image": IMAGE}]}}


class KubeDDP(Contender):
    key, title = "kube-ddp", "kube-ddp"
    group, version, plural, kind = names.GROUP, names.VERSION, names.PLURAL, names.KIND

    def manifest(self, name: str, workers: int) -> dict[str, Any]:
        return {**self._metadata(name), "spec": {"nodes": workers, "image": IMAGE}}

    def worker_pods(self, name: str, workers: int) -> list[str]:
        return [names.worker_name(name, i) for i in range(workers)]

    def finishers(self, core: Any, namespace: str, name: str) -> list[str]:
        return [names.worker_name(name, 0)]

    def succeeded(self, job: dict[str, Any]) -> bool:
        return (job.get("status") or {}).get("phase") == "Succeeded"

    def says_running(self, job: dict[str, Any]) -> bool:
        return (job.get("status") or {}).get("phase") == "Running"

    @contextmanager
    def run(self, kubeconfig: str, namespace: str, scratch: Path) -> Iterator[Running]:
        with kube_ddp_operator(kubeconfig, [namespace], scratch / f"{self.key}.log") as running:
            yield running


@functools.cache
def operator_environment() -> Path:
    """`kube-ddp` in a virtual environment made as the operator image makes its own (Dockerfile:
    the operator's dependencies, then both packages without theirs), at the versions of
    uv.lock, from this clone, once per process. Not the dev .venv's: kopf imports the
    `kubernetes` client wherever one is installed, and the image has none (12 MiB and 0.2 s of
    CPU more in every operator)."""
    uv = os.environ.get("UV") or shutil.which("uv")  # `make` and `uv run` set UV
    if uv is None:
        raise RuntimeError("uv not found: run the benchmark through make or `uv run`")
    venv = OUT / "operator-venv"
    python = ["--python", str(venv / "bin" / "python")]
    locked = OUT / "operator-locked.txt"
    project = tomllib.loads((REPO / "operator" / "pyproject.toml").read_text())["project"]
    dependencies = [d for d in project["dependencies"] if not d.startswith("ddp-trainer")]
    for command in (
        ["venv", "--quiet", "--clear", "--python", sys.executable, str(venv)],
        ["export", "--quiet", "--frozen", "--package", "kube-ddp", "--no-dev",
         "--no-emit-workspace", "--no-hashes", f"--output-file={locked}"],
        ["pip", "install", "--quiet", *python, f"--constraint={locked}", *dependencies],
        ["pip", "install", "--quiet", "--no-deps", *python,
         str(REPO / "trainer_image"), str(REPO / "operator")],
    ):  # fmt: skip
        subprocess.run([uv, *command], check=True, cwd=REPO)
    return venv / "bin" / "kube-ddp"


@contextmanager
def kube_ddp_operator(kubeconfig: str, namespaces: list[str], log: Path) -> Iterator[Running]:
    """`kube-ddp operator` watching `namespaces`, once ready; its output in `log`."""
    dev_cluster = load_dev_cluster()
    health, metrics = dev_cluster.free_port(), dev_cluster.free_port()
    command = [
        str(operator_environment()), "operator", f"--kubeconfig={kubeconfig}",
        *(f"--namespace={namespace}" for namespace in namespaces),
        f"--health-port={health}", f"--metrics-port={metrics}", "--log-format=plain",
    ]  # fmt: skip
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        readyz = f"http://127.0.0.1:{health}/readyz"
        processes = devcluster_processes()
        ready = functools.partial(processes.is_healthy, readyz)
        processes.wait_until(readyz, ready, 120, {log.stem: process}, log.parent)
        url = f"http://127.0.0.1:{metrics}/metrics"
        yield Running((process.pid,), lambda: int(_metric_sum(url, "kubeddp_jobs_synced_total")))
    finally:
        dev_cluster.peers.stop(process)


class MPIOperator(Contender):
    key, title = "mpi-operator", "MPI Operator"
    group, version, plural, kind = "kubeflow.org", "v2beta1", "mpijobs", "MPIJob"

    def manifest(self, name: str, workers: int) -> dict[str, Any]:
        return {
            **self._metadata(name),
            "spec": {
                "slotsPerWorker": 1,
                "runPolicy": {"cleanPodPolicy": "Running"},
                "mpiReplicaSpecs": {
                    "Launcher": {"replicas": 1, "template": _container("launcher")},
                    "Worker": {"replicas": workers, "template": _container("worker")},
                },
            },
        }

    def worker_pods(self, name: str, workers: int) -> list[str]:
        return [f"{name}-worker-{i}" for i in range(workers)]

    lists_finishers = True

    def pods_per_job(self, workers: int) -> int:
        return workers + 1

    def finishers(self, core: Any, namespace: str, name: str) -> list[str]:
        selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=launcher"
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        return [str(pods[0].metadata.name)]

    @contextmanager
    def run(self, kubeconfig: str, namespace: str, scratch: Path) -> Iterator[Running]:
        mpioperator = load_dev_cluster().mpioperator
        log = mpioperator.LOG
        start = log.stat().st_size if log.exists() else 0

        def synced() -> int:
            with open(log, "rb") as said:
                said.seek(start)
                return len(set(re.findall(rb'Finished syncing job "([^"]+)"', said.read())))

        # Its health port, 8080 on every interface, is fixed: wait while something else (a
        # kube-ddp operator on the real node of another test run, say) holds it.
        deadline = time.monotonic() + 900
        while devcluster_processes().http_get(mpioperator.HEALTH_URL)[0] != 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mpioperator.HEALTH_URL} stayed taken")
            time.sleep(2)
        # Its work queue's rate limiter (10 events/s, bursts of 100) held each job for about
        # a second once a run had spent the burst: raised like its client's limit.
        queue = [f"--controller-queue-rate-limit={PEER_QUEUE[0]}",
                 f"--controller-queue-burst={PEER_QUEUE[1]}"]  # fmt: skip
        with mpioperator.running(Path(kubeconfig), namespace, queue) as component:
            yield Running((component["pid"],), synced)


class TrainingOperator(Contender):
    key, title = "training-operator", "Training Operator v1"
    group, version, plural, kind = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"

    def manifest(self, name: str, workers: int) -> dict[str, Any]:
        replicas = {"Master": {"replicas": 1, "template": _container("pytorch")}}
        if workers > 1:
            replicas["Worker"] = {"replicas": workers - 1, "template": _container("pytorch")}
        return {
            **self._metadata(name),
            "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "pytorchReplicaSpecs": replicas},
        }

    def worker_pods(self, name: str, workers: int) -> list[str]:
        return [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(workers - 1))]

    def finishers(self, core: Any, namespace: str, name: str) -> list[str]:
        return [f"{name}-master-0"]

    @contextmanager
    def run(self, kubeconfig: str, namespace: str, scratch: Path) -> Iterator[Running]:
        peers = load_dev_cluster().peers
        extra = [f"--kube-api-qps={PEER_QPS[0]}", f"--kube-api-burst={PEER_QPS[1]}",
                 f"--controller-threads={PEER_WORKERS}"]  # fmt: skip
        with peers.training_operator(Path(kubeconfig), namespace, scratch, extra) as (
            process,
            port,
        ):
            url = f"http://127.0.0.1:{port}/metrics"
            yield Running(
                (process.pid,),
                lambda: int(
                    _metric_sum(url, "controller_runtime_reconcile_total", 'result="success"')
                ),
            )


JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on every pod of a JobSet


class TrainerV2(Contender):
    key, title = "trainer-v2", "Trainer v2 + JobSet"
    group, version, plural, kind = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
    lists_finishers = True

    def manifest(self, name: str, workers: int) -> dict[str, Any]:
        runtime = load_dev_cluster().kubeflow_trainer.RUNTIME
        return {
            **self._metadata(name),
            "spec": {
                "runtimeRef": {"name": runtime},
                "trainer": {"numNodes": workers, "image": IMAGE},
            },
        }

    def worker_pods(self, name: str, workers: int) -> list[str]:
        return [f"{name}-node-0-{i}" for i in range(workers)]

    def pod_key(self, pod: Any) -> str:
        return str(pod.spec.hostname or pod.metadata.name)  # an Indexed Job's: <job>-<index>

    def finishers(self, core: Any, namespace: str, name: str) -> list[str]:
        selector = f"{JOBSET_NAME_LABEL}={name}"
        return [
            str(p.metadata.name)
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        ]

    def succeeded(self, job: dict[str, Any]) -> bool:
        return _condition_true(job, "Complete")

    def says_running(self, job: dict[str, Any]) -> bool:
        # No Running condition: each replicated Job's count of ready Jobs (one per job here).
        jobs = (job.get("status") or {}).get("jobsStatus") or []
        return bool(jobs) and all((j.get("ready") or 0) >= 1 for j in jobs)

    @contextmanager
    def run(self, kubeconfig: str, namespace: str, scratch: Path) -> Iterator[Running]:
        trainer = load_dev_cluster().kubeflow_trainer
        with trainer.running(Path(kubeconfig), scratch) as running:
            url = f"http://127.0.0.1:{running.trainer_metrics}/metrics"
            reconciled = 'controller="trainjob_controller",result="success"'
            yield Running(
                running.pids,
                lambda: int(_metric_sum(url, "controller_runtime_reconcile_total", reconciled)),
            )


class Floor(KubeDDP):
    key, title = "floor", "floor (no controller)"
    stages = ("apply", "burst")
    ROUND_THREADS = 16  # requests of one job at once; the operator's asyncio has no limit

    def __init__(self) -> None:
        self._clients: dict[int, Any] = {}

    def create(self, api: Any, namespace: str, name: str, workers: int) -> None:
        """The children kube-ddp's operator would create for the job, as it creates them: the
        kinds others name first, then the rest and the pods, each round's requests at once.
        Raw POSTs whose answers are not decoded: the client must not be the limit."""
        job = load_job(self.manifest(name, workers), namespace)
        children = build_children(job, attempt=0, settings=BuildSettings())
        first = [c for c in children if c["kind"] in FIRST_ROUND_KINDS]
        then = [c for c in children if c["kind"] not in FIRST_ROUND_KINDS]
        client = self._client(api)
        with ThreadPoolExecutor(self.ROUND_THREADS) as pool:
            for round_ in (first, then):
                list(pool.map(lambda child: _post(client, namespace, child), round_))

    def _client(self, api: Any) -> Any:
        """A client on `api`'s configuration with a connection pool for every request at once
        (the default keeps 5 a core, and opens and drops the others)."""
        if id(api) not in self._clients:
            configuration = copy.copy(api.configuration)
            # a burst creates 8 jobs at once (operator_measure.Bench.create_many)
            configuration.connection_pool_maxsize = 8 * self.ROUND_THREADS
            self._clients[id(api)] = kubernetes.client.ApiClient(configuration)
        return self._clients[id(api)]

    @contextmanager
    def run(self, kubeconfig: str, namespace: str, scratch: Path) -> Iterator[Running]:
        yield Running((os.getpid(),), lambda: 0)  # no process of its own: the client's


def _post(client: Any, namespace: str, child: dict[str, Any]) -> None:
    path = collection_path(child["apiVersion"], child["kind"], namespace)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    answer = client.call_api("POST", client.configuration.host + path, headers, child)
    said = answer.read()  # read whole, or the connection never goes back to the pool
    if answer.status != 201:
        raise RuntimeError(f"POST {path}: {answer.status} {said[:300]!r}")


CONTENDERS: dict[str, Contender] = {
    c.key: c for c in (KubeDDP(), MPIOperator(), TrainingOperator(), TrainerV2(), Floor())
}
