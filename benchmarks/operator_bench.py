"""Operator benchmark on the local control plane (hack/dev-cluster.py): how fast jobs get pods,
how fast a finished job is marked, and what the operator costs in memory.

Timings are taken on the client side from watch events, in one run, on this machine:
  apply latency     create a job, time until all of its worker pods exist (50 jobs, 2 workers)
  burst             200 jobs x 4 workers created at once, time until all 800 pods exist
  completion        worker 0 Succeeded (pod watch) -> job Succeeded (job watch), 30 jobs
  memory            operator RSS with 1,000 jobs tracked (1 worker each)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes

from kube_ddp import names
from tests.cluster.support import load_dev_cluster

REPO = Path(__file__).resolve().parents[1]
KUBE_DDP = Path(sys.executable).with_name("kube-ddp")


class Watcher:
    """Records when each object of a kind in a namespace was first seen in a given state."""

    def __init__(
        self, list_fn: Callable[..., Any], *args: str, key: Callable[[Any], str | None]
    ) -> None:
        self.first_seen: dict[str, float] = {}
        self.changed = threading.Condition()
        self.error: Exception | None = None
        self._stopped = False
        self._list = list_fn
        self._args = args
        self._key = key
        self._watch = kubernetes.watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._watch.stream(self._list, *self._args, timeout_seconds=3600):
                key = self._key(event["object"])
                if key and key not in self.first_seen:
                    with self.changed:
                        self.first_seen[key] = time.perf_counter()
                        self.changed.notify_all()
        except Exception as error:  # stop() closes the stream under the reader
            if not self._stopped:
                self.error = error
                with self.changed:
                    self.changed.notify_all()

    def wait(self, keys: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not keys <= self.first_seen.keys():
                if self.error is not None:
                    raise RuntimeError(f"the watch broke: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(keys - self.first_seen.keys())[:5]
                    raise TimeoutError(f"still waiting for {len(missing)}+ objects: {missing}")
                self.changed.wait(left)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def pod_key(pod: Any) -> str:
    return str(pod.metadata.name)


def job_manifest(name: str, nodes: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name},
        "spec": {"nodes": nodes, **spec},
    }


class Bench:
    def __init__(self, api: kubernetes.client.ApiClient, kubeconfig: str) -> None:
        self.api = api
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.kubeconfig = kubeconfig

    @contextmanager
    def namespace(self) -> Iterator[str]:
        name = f"bench-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        deadline = time.monotonic() + 30
        while not self.core.list_namespaced_service_account(name).items:
            if time.monotonic() > deadline:
                raise TimeoutError("no default ServiceAccount")
            time.sleep(0.1)
        try:
            yield name
        finally:
            self.core.delete_namespace(name)

    @contextmanager
    def operator(self, namespace: str, log: Path) -> Iterator[Any]:
        command = [
            str(KUBE_DDP),
            "operator",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={namespace}",
            "--health-port=0",
            "--metrics-port=0",
        ]
        with open(log, "wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        time.sleep(3)  # start-up (imports, first LIST) is not what is measured
        try:
            yield process
        finally:
            process.terminate()
            process.wait(timeout=20)

    def create(self, namespace: str, manifest: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.PLURAL, manifest
        )

    def apply_latency(self, namespace: str, jobs: int = 50, nodes: int = 2) -> dict[str, float]:
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=pod_key)
        samples = []
        try:
            for i in range(-1, jobs):  # job -1 warms the operator up and is not counted
                name = f"lat-{i}" if i >= 0 else "warm-up"
                wanted = {names.worker_name(name, n) for n in range(nodes)}
                start = time.perf_counter()
                self.create(namespace, job_manifest(name, nodes))
                pods.wait(wanted, timeout=30)
                if i >= 0:
                    samples.append(max(pods.first_seen[p] for p in wanted) - start)
        finally:
            pods.stop()
        return summary(samples)

    def burst(self, namespace: str, jobs: int = 200, nodes: int = 4) -> dict[str, float]:
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=pod_key)
        wanted = {names.worker_name(f"burst-{i}", n) for i in range(jobs) for n in range(nodes)}
        try:
            start = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        lambda i: self.create(namespace, job_manifest(f"burst-{i}", nodes)),
                        range(jobs),
                    )
                )
            created = time.perf_counter() - start
            pods.wait(wanted, timeout=300)
            total = max(pods.first_seen.values()) - start
        finally:
            pods.stop()
        return {"jobs": jobs, "pods": len(wanted), "create_calls_s": created, "all_pods_s": total}

    def completion(self, namespace: str, jobs: int = 30) -> dict[str, float]:
        def succeeded_pod(pod: Any) -> str | None:
            return str(pod.metadata.name) if pod.status.phase == "Succeeded" else None

        def succeeded_job(job: Any) -> str | None:
            if (job.get("status") or {}).get("phase") == "Succeeded":
                return str(job["metadata"]["name"])
            return None

        running = Watcher(self.core.list_namespaced_pod, namespace, key=_running_pod)
        names_ = [f"done-{i}" for i in range(jobs)]
        for name in names_:
            self.create(namespace, job_manifest(name, 2))
        running.wait({names.worker_name(n, i) for n in names_ for i in range(2)}, timeout=120)
        running.stop()
        time.sleep(1)  # let the jobs' Running status writes settle
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=succeeded_pod)
        finished = Watcher(
            self.custom.list_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            namespace,
            names.PLURAL,
            key=succeeded_job,
        )
        try:
            for name in names_:
                body = {"metadata": {"annotations": {"sim.kubeddp.io/exit-code": "0"}}}
                self.core.patch_namespaced_pod(names.worker_name(name, 0), namespace, body)
                finished.wait({name}, timeout=30)
            samples = [
                finished.first_seen[n] - pods.first_seen[names.worker_name(n, 0)] for n in names_
            ]
        finally:
            pods.stop()
            finished.stop()
        return summary(samples)

    def memory(self, namespace: str, process: Any, jobs: int = 1000) -> dict[str, float]:
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=pod_key)
        try:
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        lambda i: self.create(namespace, job_manifest(f"mem-{i}", 1)), range(jobs)
                    )
                )
            pods.wait({names.worker_name(f"mem-{i}", 0) for i in range(jobs)}, timeout=600)
        finally:
            pods.stop()
        time.sleep(5)
        return {"jobs": jobs, "rss_mib": rss_mib(process.pid)}


def _running_pod(pod: Any) -> str | None:
    return str(pod.metadata.name) if pod.status.phase == "Running" else None


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "p50_s": statistics.median(ordered),
        "p99_s": p99,
        "max_s": ordered[-1],
    }


def bench_nodes(core: Any) -> None:
    """Room for the memory run: fake nodes that take 1,000 pods between them."""
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": "500"}
    for i in range(3):
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"bench-node-{i}",
                "labels": {"type": "kwok"},
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        try:
            core.create_node(node)
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise


STAGES = ("apply_latency", "burst", "completion", "memory")


def measure(out: Path, stages: tuple[str, ...] = STAGES) -> dict[str, Any]:
    """Run `stages` on the local control plane, starting it (and stopping it after) if needed."""
    dev_cluster = load_dev_cluster()
    started_here = dev_cluster.running_state() is None
    state = dev_cluster.up(owner="bench")
    try:
        return _measure(state["kubeconfig"], out, stages)
    finally:
        if started_here:
            dev_cluster.down()


def _measure(kubeconfig: str, out: Path, stages: tuple[str, ...]) -> dict[str, Any]:
    api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    bench = Bench(api, kubeconfig)
    kubectl = [str(REPO / ".cluster" / "bin" / "kubectl"), f"--kubeconfig={kubeconfig}"]
    crd = str(REPO / "manifests" / "crd.yaml")
    subprocess.run([*kubectl, "apply", "--server-side", "-f", crd], check=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd/ddptrainingjobs.kubeddp.io"],
        check=True,
    )
    bench_nodes(bench.core)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for stage in stages:
        with (
            bench.namespace() as namespace,
            bench.operator(namespace, out / f"operator-{stage}.log") as process,
        ):
            print(f"operator bench: {stage} ...", flush=True)
            if stage == "memory":
                results[stage] = bench.memory(namespace, process)
            else:
                results[stage] = getattr(bench, stage)(namespace)
            print(f"  {json.dumps(results[stage])}", flush=True)
    return results


TARGETS = {
    "apply p50": 0.3,
    "apply p99": 1.0,
    "burst": 20.0,
    "completion p50": 0.5,
    "memory": 150.0,
}


def run(args: argparse.Namespace) -> str:
    """`python -m benchmarks operator`: measure, and the markdown section of BENCHMARKS.md."""
    started = time.time()
    load_before = os.getloadavg()[0]
    results = measure(REPO / ".bench")
    minutes = (time.time() - started) / 60
    apply, burst = results["apply_latency"], results["burst"]
    completion, memory = results["completion"], results["memory"]
    rows = [
        ("apply -> all worker pods exist, p50", apply["p50_s"], "apply p50", "s"),
        ("apply -> all worker pods exist, p99", apply["p99_s"], "apply p99", "s"),
        ("burst: 200 jobs x 4 workers -> 800 pods exist", burst["all_pods_s"], "burst", "s"),
        ("worker 0 Succeeded -> job Succeeded, p50", completion["p50_s"], "completion p50", "s"),
        ("operator resident memory, 1,000 jobs tracked", memory["rss_mib"], "memory", "MiB"),
    ]
    lines = [
        "## Operator",
        "",
        "Command: `make bench` (or `python -m benchmarks operator`), on the local control plane",
        "of hack/dev-cluster.py (real kube-apiserver, etcd, scheduler, kwok nodes), one operator",
        "process per stage watching its own namespace. Times are taken by the client from watch",
        "events; apply latency is sequential over 50 jobs of 2 workers (after one warm-up job);",
        "completion is over 30 jobs of 2 workers.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {cpu_model()}; the control",
        "plane, the operator and the benchmark client share these cores. Load average before",
        f"the run: {load_before:.2f}. Run took {minutes:.1f} min.",
        "",
        "| measure | result | target | met |",
        "| --- | --- | --- | --- |",
    ]
    for label, value, target_key, unit in rows:
        target = TARGETS[target_key]
        lines.append(
            f"| {label} | {value:.3g} {unit} | <= {target:g} {unit} | "
            f"{'yes' if value <= target else 'no'} |"
        )
    lines += [
        "",
        f"Apply latency: n={apply['n']}, max {apply['max_s']:.3g} s. Completion: "
        f"n={completion['n']}, p99 {completion['p99_s']:.3g} s. Burst: the 200 create calls "
        f"themselves took {burst['create_calls_s']:.3g} s.",
    ]
    return "\n".join(lines)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    parser.add_argument("--stage", action="append", choices=STAGES, help="default: all")
    args = parser.parse_args(argv)
    results = measure(args.out, tuple(args.stage or STAGES))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
