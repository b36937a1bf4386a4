"""Operator benchmark: kube-ddp and Kubeflow's controllers (benchmarks/contenders.py) side by
side on the local control plane (hack/dev-cluster.py: real kube-apiserver, etcd, scheduler,
controller manager, kwok nodes), in one run. Each stage runs each contender in turn, in a fresh
namespace with its controller just started and watching only that namespace; one controller
runs at a time, so the API server's own request counters are the contender's (and what its
objects cost the scheduler, kwok and the controller manager).

  apply       create a job, time until all of its worker pods exist (sequential; 2 and 8 workers)
  burst       N jobs x 4 workers created at once, time until all pods exist (N = 200, 1,000)
  completion  the pod whose exit ends the job Succeeded (pod watch) -> job Succeeded (job watch)
  lifecycle   API server requests per job: create -> running -> succeeded -> deleted, gone
  scale       controller RSS and CPU seconds with 1,000 (and 10,000) jobs' pods Running
  restart     the controller stopped and started with those 1,000 jobs live: time until it
              reconciled every one, and the API requests that cost

Times are taken by the client from watch events (time.perf_counter).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import re
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes

from benchmarks.contenders import CONTENDERS, Contender, Running, devcluster_processes
from benchmarks.markdown import replace_section
from tests.cluster.support import load_dev_cluster

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / ".bench"


@dataclass(frozen=True)
class Sizes:
    apply_jobs: int = 50
    apply_workers: tuple[int, ...] = (2, 8)
    bursts: tuple[int, ...] = (200, 1000)
    burst_workers: int = 4
    completion_jobs: int = 50
    lifecycle_jobs: int = 20
    scale_jobs: tuple[int, ...] = (1000, 10000)  # the last only for `scale_all_upto` or kube-ddp
    scale_peers_upto: int = 1000  # peers stop here (time: see docs/BENCHMARKS.md)
    idle_s: float = 10.0  # how long the idle request rate is measured


QUICK = Sizes(
    apply_jobs=3,
    apply_workers=(2,),
    bursts=(5,),
    completion_jobs=3,
    lifecycle_jobs=2,
    scale_jobs=(10,),
    scale_peers_upto=10,
    idle_s=2.0,
)


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


def pod_name(pod: Any) -> str:
    return str(pod.metadata.name)


def running_pod(pod: Any) -> str | None:
    return str(pod.metadata.name) if pod.status.phase == "Running" else None


def succeeded_pod(pod: Any) -> str | None:
    return str(pod.metadata.name) if pod.status.phase == "Succeeded" else None


# --- the API server's request counters -------------------------------------------------------

SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
RequestKey = tuple[str, str]  # (verb, resource[/subresource] with its group when not core)


def api_requests() -> Counter[RequestKey]:
    """apiserver_request_total by verb and resource, from the API server's /metrics."""
    dev_cluster = load_dev_cluster()
    server = dev_cluster.read_state()["server"]
    processes = devcluster_processes()
    status, body = processes.http_get(f"{server}/metrics", processes.tls_context())
    if status != 200:
        raise RuntimeError(f"the API server's /metrics answered {status}")
    counts: Counter[RequestKey] = Counter()
    for line in body.decode().splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        labels = dict(LABEL.findall(match["labels"]))
        if not labels.get("resource"):
            continue  # /metrics, /healthz, discovery: not a resource request
        resource = labels["resource"] + (
            f"/{labels['subresource']}" if labels["subresource"] else ""
        )
        if labels.get("group"):
            resource = f"{resource}.{labels['group']}"
        counts[(labels["verb"], resource)] += int(float(match["value"]))
    return counts


@dataclass
class RequestWindow:
    """API requests between `start` and `stop`, less the idle rate and the client's own."""

    idle_per_s: dict[RequestKey, float]
    client: Counter[RequestKey] = field(default_factory=Counter)
    before: Counter[RequestKey] = field(default_factory=Counter)
    started: float = 0.0
    result: dict[RequestKey, float] = field(default_factory=dict)

    def start(self) -> None:
        self.before = api_requests()
        self.started = time.monotonic()

    def stop(self) -> dict[RequestKey, float]:
        after = api_requests()
        seconds = time.monotonic() - self.started
        keys = set(after) | set(self.idle_per_s)
        self.result = {}
        for key in keys:
            count = after[key] - self.before[key] - self.client[key]
            count -= self.idle_per_s.get(key, 0.0) * seconds
            if abs(count) >= 0.5:
                self.result[key] = count
        return self.result


def idle_rate(seconds: float) -> dict[RequestKey, float]:
    """Requests per second with nothing to do (leases, node heartbeats, leader election)."""
    before = api_requests()
    time.sleep(seconds)
    after = api_requests()
    return {key: (after[key] - before[key]) / seconds for key in after if after[key] > before[key]}


# --- the process ------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def summary(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "p50_s": statistics.median(ordered),
        "p99_s": p99,
        "min_s": ordered[0],
        "max_s": ordered[-1],
        "samples": samples,
    }


# --- the stages -------------------------------------------------------------------------------


class Bench:
    def __init__(self, kubeconfig: str, out: Path) -> None:
        self.api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.kubeconfig = kubeconfig
        self.out = out

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
            # The namespace controller left the MPI Operator's launcher Jobs (and so their pods,
            # which hold the Job controller's finalizer) in place for minutes: delete them first.
            kubernetes.client.BatchV1Api(self.api).delete_collection_namespaced_job(
                name, propagation_policy="Background"
            )
            self.core.delete_namespace(name)
            self.wait_gone(name)

    def wait_gone(self, namespace: str, timeout: float = 900) -> None:
        """A deleted namespace's pods, gone: the next stage starts on an idle control plane."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace(namespace)
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return
                raise
            time.sleep(1)
        raise TimeoutError(f"namespace {namespace} still there after {timeout:.0f} s")

    @contextmanager
    def contender(self, contender: Contender, stage: str) -> Iterator[tuple[str, Running]]:
        with self.namespace() as namespace:
            scratch = self.out / f"{stage}-{contender.key}"
            scratch.mkdir(parents=True, exist_ok=True)
            with contender.run(self.kubeconfig, namespace, scratch) as running:
                yield namespace, running

    def create(self, contender: Contender, namespace: str, name: str, workers: int) -> None:
        self.custom.create_namespaced_custom_object(
            contender.group,
            contender.version,
            namespace,
            contender.plural,
            contender.manifest(name, workers),
        )

    def create_many(
        self, contender: Contender, namespace: str, names: list[str], workers: int
    ) -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: self.create(contender, namespace, n, workers), names))

    def job_watcher(
        self, contender: Contender, namespace: str, key: Callable[[dict[str, Any]], str | None]
    ) -> Watcher:
        return Watcher(
            self.custom.list_namespaced_custom_object,
            contender.group,
            contender.version,
            namespace,
            contender.plural,
            key=key,
        )

    def apply(
        self, contender: Contender, namespace: str, jobs: int, workers: int
    ) -> dict[str, Any]:
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=pod_name)
        samples = []
        try:
            for i in range(-1, jobs):  # job -1 warms the controller up and is not counted
                name = f"lat{workers}-{i}" if i >= 0 else f"warm-up-{workers}"
                wanted = set(contender.worker_pods(name, workers))
                start = time.perf_counter()
                self.create(contender, namespace, name, workers)
                pods.wait(wanted, timeout=60)
                if i >= 0:
                    samples.append(max(pods.first_seen[p] for p in wanted) - start)
        finally:
            pods.stop()
        return summary(samples)

    def burst(
        self, contender: Contender, namespace: str, jobs: int, workers: int
    ) -> dict[str, Any]:
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=pod_name)
        names = [f"burst-{i}" for i in range(jobs)]
        wanted = {p for n in names for p in contender.worker_pods(n, workers)}
        try:
            start = time.perf_counter()
            self.create_many(contender, namespace, names, workers)
            created = time.perf_counter() - start
            pods.wait(wanted, timeout=1800)
            total = max(pods.first_seen[p] for p in wanted) - start
        finally:
            pods.stop()
        return {"jobs": jobs, "pods": len(wanted), "create_calls_s": created, "all_pods_s": total}

    def run_to_running(
        self, contender: Contender, namespace: str, names: list[str], workers: int
    ) -> None:
        running = Watcher(self.core.list_namespaced_pod, namespace, key=running_pod)
        try:
            self.create_many(contender, namespace, names, workers)
            wanted = {p for n in names for p in contender.worker_pods(n, workers)}
            running.wait(wanted, timeout=3600)
        finally:
            running.stop()

    def completion(
        self, contender: Contender, namespace: str, jobs: int, window: RequestWindow | None = None
    ) -> dict[str, Any]:
        """Jobs of 2 workers, created at once, run, then ended one by one; with a `window`, the
        whole lifecycle (ending with the jobs deleted and their pods gone) is counted in it."""
        names = [f"done-{i}" for i in range(jobs)]
        finished = self.job_watcher(
            contender,
            namespace,
            lambda job: str(job["metadata"]["name"]) if contender.succeeded(job) else None,
        )
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=succeeded_pod)
        client = window.client if window else Counter()
        resource = f"{contender.plural}.{contender.group}"
        try:
            if window:
                window.start()
            self.run_to_running(contender, namespace, names, 2)
            client[("POST", resource)] += jobs
            time.sleep(1)  # let the jobs' Running status writes settle
            finishers = {}
            for name in names:
                finishers[name] = pod = contender.finisher(self.core, namespace, name)
                if contender.key == "mpi-operator":
                    client[("LIST", "pods")] += 1
                body = {"metadata": {"annotations": {"sim.kubeddp.io/exit-code": "0"}}}
                self.core.patch_namespaced_pod(pod, namespace, body)
                client[("PATCH", "pods")] += 1
                finished.wait({name}, timeout=60)
            samples = [finished.first_seen[n] - pods.first_seen[finishers[n]] for n in names]
            if window:
                for name in names:
                    self.custom.delete_namespaced_custom_object(
                        contender.group, contender.version, namespace, contender.plural, name
                    )
                    client[("DELETE", resource)] += 1
                deadline = time.monotonic() + 300
                while self.core.list_namespaced_pod(namespace).items:
                    client[("LIST", "pods")] += 1
                    if time.monotonic() > deadline:
                        raise TimeoutError("pods of deleted jobs still there")
                    time.sleep(0.5)
                client[("LIST", "pods")] += 1
                time.sleep(2)  # the garbage collector's last deletes
                window.stop()
        finally:
            pods.stop()
            finished.stop()
        return summary(samples)

    def scale(
        self,
        contender: Contender,
        sizes: tuple[int, ...],
        idle: dict[RequestKey, float],
        found: dict[str, Any],
        save: Callable[[], None],
    ) -> None:
        """Jobs of one worker kept Running: the controller's RSS and CPU seconds with sizes[0]
        jobs; then it is restarted with those live (the restart measure), and the restarted one
        is taken on to the other sizes. Fills `found` as it goes, calling `save` after each
        step (the largest size takes long: what was measured before it is kept)."""
        scale: list[dict[str, float]] = found.setdefault("scale", [])

        def grow(running: Running, created: int, jobs: int, cpu_from: float) -> None:
            names = [f"s-{i}" for i in range(created, jobs)]
            start = time.monotonic()
            self.run_to_running(contender, namespace, names, 1)
            time.sleep(5)  # queues drain
            point = {
                "jobs": jobs,
                "rss_mib": rss_mib(running.pid),
                "cpu_s": cpu_seconds(running.pid) - cpu_from,
                "wall_s": time.monotonic() - start,
            }
            scale.append(point)
            save()
            print(f"  {contender.key}: {json.dumps(point)}", flush=True)

        with self.namespace() as namespace:
            scratch = self.out / f"scale-{contender.key}"
            scratch.mkdir(parents=True, exist_ok=True)
            with contender.run(self.kubeconfig, namespace, scratch) as running:
                grow(running, 0, sizes[0], 0.0)
            window = RequestWindow(idle)
            window.start()
            start = time.perf_counter()
            with contender.run(self.kubeconfig, namespace, scratch) as running:
                deadline = time.monotonic() + 600
                while running.synced() < sizes[0]:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{running.synced()} of {sizes[0]} jobs re-synced")
                    time.sleep(0.1)
                resync = time.perf_counter() - start
                cpu = cpu_seconds(running.pid)
                time.sleep(3)  # what it does right after its last first reconcile
                requests = window.stop()
                found["restart"] = {"jobs": sizes[0], "resync_s": resync, "cpu_s": cpu,
                    "rss_mib": rss_mib(running.pid), "requests": _keyed(requests)}  # fmt: skip
                save()
                print(f"  {contender.key} restart: {resync:.1f} s", flush=True)
                for before, jobs in itertools.pairwise(sizes):
                    grow(running, before, jobs, cpu_seconds(running.pid))


def bench_nodes(core: Any, pods: int) -> None:
    """Fake nodes with room for `pods` pods between them (kwok keeps none of them busy)."""
    if pods <= 300:
        return  # the dev cluster's own nodes take that many
    per_node = 2500
    capacity = {"cpu": "10000", "memory": "64Ti", "pods": str(per_node)}
    for i in range(-(-pods // per_node)):
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


STAGES = ("apply", "completion", "burst", "scale")
# Rows of the request tables that are the harness's, not a controller's: the peers' runners
# apply their CRD and check their namespace before each start.
HARNESS_RESOURCES = ("customresourcedefinitions.apiextensions.k8s.io", "namespaces")


def measure(
    out: Path, sizes: Sizes, contenders: list[Contender], stages: tuple[str, ...] = STAGES
) -> dict[str, Any]:
    """Run `stages` on the local control plane, starting it (and stopping it after) if needed."""
    dev_cluster = load_dev_cluster()
    started_here = dev_cluster.running_state() is None
    state = dev_cluster.up(owner="bench")
    try:
        return _measure(state["kubeconfig"], out, sizes, contenders, stages)
    finally:
        if started_here:
            dev_cluster.down()


def _measure(
    kubeconfig: str, out: Path, sizes: Sizes, contenders: list[Contender], stages: tuple[str, ...]
) -> dict[str, Any]:
    bench = Bench(kubeconfig, out)
    dev_cluster = load_dev_cluster()
    crd = REPO / "manifests" / "crd.yaml"
    dev_cluster.controlplane.apply_crds([crd], ["ddptrainingjobs.kubeddp.io"], Path(kubeconfig))
    most_pods = max(
        [sizes.burst_workers * n + n for n in sizes.bursts if "burst" in stages]
        + [2 * n for n in sizes.scale_jobs if "scale" in stages]
        + [0]
    )
    bench_nodes(bench.core, most_pods)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "load": [],
        "contenders": {c.key: c.title for c in contenders},
        "sizes": dataclasses.asdict(sizes),
    }

    def stage(name: str, contender: Contender) -> None:
        load = os.getloadavg()[0]
        results["load"].append(load)
        print(f"operator bench: {name}, {contender.key} (load {load:.2f}) ...", flush=True)

    def save() -> None:
        results["minutes"] = (time.monotonic() - started) / 60
        (out / "results.json").write_text(json.dumps(results, indent=1))

    started = time.monotonic()
    results["idle_per_s"] = _keyed(idle_rate(sizes.idle_s))
    if "apply" in stages:
        for workers in sizes.apply_workers:
            for contender in contenders:
                stage(f"apply {sizes.apply_jobs} x {workers} workers", contender)
                with bench.contender(contender, f"apply{workers}") as (namespace, _):
                    found = bench.apply(contender, namespace, sizes.apply_jobs, workers)
                results.setdefault(f"apply{workers}", {})[contender.key] = found
                save()
    if "completion" in stages:
        for contender in contenders:
            stage(f"completion and lifecycle, {sizes.completion_jobs} jobs", contender)
            with bench.contender(contender, "completion") as (namespace, _):
                window = RequestWindow(
                    idle_rate(sizes.idle_s)
                )  # its own leases and resyncs included
                found = bench.completion(contender, namespace, sizes.completion_jobs, window)
            found["requests_per_job"] = {
                key: count / sizes.completion_jobs for key, count in _keyed(window.result).items()
            }
            results.setdefault("completion", {})[contender.key] = found
            save()
    if "burst" in stages:
        for jobs in sizes.bursts:
            for contender in contenders:
                stage(f"burst {jobs} x {sizes.burst_workers}", contender)
                with bench.contender(contender, f"burst{jobs}") as (namespace, _):
                    found = bench.burst(contender, namespace, jobs, sizes.burst_workers)
                results.setdefault(f"burst{jobs}", {})[contender.key] = found
                save()
                print(f"  {json.dumps(found)}", flush=True)
    if "scale" in stages:
        idle = idle_rate(sizes.idle_s)
        # kube-ddp last: its largest size takes longest (a quarter of an hour for 10,000).
        for contender in [*contenders[1:], contenders[0]]:
            upto = max(sizes.scale_jobs) if contender.key == "kube-ddp" else sizes.scale_peers_upto
            steps = tuple(n for n in sizes.scale_jobs if n <= upto)
            stage(f"scale {steps} and restart", contender)
            found = results.setdefault("scale", {}).setdefault(contender.key, {})
            bench.scale(contender, steps, idle, found, save)
    results["minutes"] = (time.monotonic() - started) / 60
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


def _keyed(requests: dict[RequestKey, float]) -> dict[str, float]:
    """'VERB resource' -> count, without the harness's own rows."""
    return {
        f"{verb} {resource}": round(count, 2)
        for (verb, resource), count in sorted(requests.items())
        if resource not in HARNESS_RESOURCES
    }


# --- the report -------------------------------------------------------------------------------

DOCS = REPO / "docs"
DOCUMENT = DOCS / "BENCHMARKS.md"
PLOT_LATENCY = DOCS / "benchmarks-operator-latency.png"
PLOT_SCALE = DOCS / "benchmarks-operator-memory.png"
GOALS = {
    "apply": "kube-ddp / MPI Operator <= 1.0x at p50 and p99",
    "burst": "kube-ddp / MPI Operator <= 1.0x with 1,000 jobs",
    "requests": "kube-ddp <= each peer",
    "scale": "kube-ddp <= 300 MiB with 10,000 jobs",
    "restart": "kube-ddp <= 30 s with 1,000 jobs",
}


def _cells(values: dict[str, float | None], keys: list[str], fmt: Callable[[float], str]) -> str:
    """kube-ddp's value, then each peer's value and the ratio kube-ddp / peer."""
    ours = values.get("kube-ddp")
    cells = [fmt(ours) if ours is not None else "-"]
    for key in keys[1:]:
        theirs = values.get(key)
        cells.append(fmt(theirs) if theirs is not None else "not run")
        ratio = f"{ours / theirs:.2f}x" if ours is not None and theirs else "-"
        cells.append(ratio)
    return " | ".join(cells)


def _header(first: str, results: dict[str, Any]) -> list[str]:
    titles = list(results["contenders"].values())
    columns = [first, titles[0]]
    for title in titles[1:]:
        columns += [title, "ratio"]
    return ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]


def seconds(value: float) -> str:
    return f"{value:.3g} s"


def render(results: dict[str, Any], sizes: Sizes, command: str) -> str:
    keys = list(results["contenders"])
    load = results["load"]
    lines = [
        "## Operator, side by side with Kubeflow's controllers",
        "",
        f"Command: `{command}`. Results of one run ({results['minutes']:.0f} min);",
        "raw figures in `.bench/results.json` (git-ignored).",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {cpu_model()}, "
        f"{_memory_gib():.0f} GiB; Python {platform.python_version()}. The control plane",
        "(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok), the controller",
        "under test and the benchmark client share these cores, and other work ran on the machine",
        f"at the same time: load average (1 min) at the start of each stage {min(load):.1f} to "
        f"{max(load):.1f}, median {statistics.median(load):.1f}. Figures are noisy; the ratios,",
        "taken minutes apart under the same conditions, say more than the absolute times.",
        "",
        "How: each stage runs each controller in turn, kube-ddp first (last in the scale stage),",
        "each in a fresh namespace",
        "that only it watches, with its controller just started (one controller at a time);",
        "times are taken by the client from watch events. Controllers: "
        + ", ".join(results["contenders"].values())
        + " (benchmarks/contenders.py says which job each runs and with which flags).",
        "",
    ]
    lines += [*_goals(results, sizes), ""]
    apply_rows = []
    for workers in sizes.apply_workers:
        found = results.get(f"apply{workers}")
        if not found:
            continue
        for label, field_ in (("p50", "p50_s"), ("p99", "p99_s")):
            values = {k: v[field_] for k, v in found.items()}
            apply_rows.append(f"| {workers} workers, {label} | {_cells(values, keys, seconds)} |")
        spread = {k: f"{v['min_s']:.3g}-{v['max_s']:.3g} s" for k, v in found.items()}
        apply_rows.append(
            f"| {workers} workers, min-max | "
            + " | ".join(
                [spread["kube-ddp"], *(x for k in keys[1:] for x in (spread.get(k, "-"), ""))]
            )
            + " |"
        )
    if apply_rows:
        lines += [
            f"### Apply -> all worker pods exist ({sizes.apply_jobs} jobs in a row, after one "
            "warm-up job)",
            "",
            *_header("jobs of", results),
            *apply_rows,
            "",
            f"Goal: {GOALS['apply']}. ![apply latency]({PLOT_LATENCY.name})",
            "",
        ]
    burst_rows = []
    for jobs in sizes.bursts:
        found = results.get(f"burst{jobs}")
        if found:
            values = {k: v["all_pods_s"] for k, v in found.items()}
            burst_rows.append(
                f"| {jobs:,} x {sizes.burst_workers} | {_cells(values, keys, seconds)} |"
            )
    if burst_rows:
        calls = "; ".join(
            f"{results['contenders'][k]} {v['create_calls_s']:.3g} s"
            for jobs in sizes.bursts
            for k, v in results.get(f"burst{jobs}", {}).items()
            if jobs == max(sizes.bursts)
        )
        lines += [
            "### Burst: jobs created at once (8 client threads) -> all worker pods exist",
            "",
            *_header("jobs x workers", results),
            *burst_rows,
            "",
            f"Goal: {GOALS['burst']}. The create calls themselves ({max(sizes.bursts):,} jobs): "
            f"{calls}.",
            "",
        ]
    completion = results.get("completion")
    if completion:
        lines += [
            f"### The last pod Succeeded -> job Succeeded ({sizes.completion_jobs} jobs of 2 "
            "workers, ended one at a time)",
            "",
            "The pod whose exit ends the job: kube-ddp's worker 0, the MPIJob's launcher, the",
            "PyTorchJob's master.",
            "",
            *_header("", results),
        ]
        for label, field_ in (("p50", "p50_s"), ("p99", "p99_s")):
            values = {k: v[field_] for k, v in completion.items()}
            lines.append(f"| {label} | {_cells(values, keys, seconds)} |")
        lines += ["", *_requests_section(results, completion, keys, sizes)]
    scale = results.get("scale")
    if scale:
        lines += [*_scale_section(results, scale, keys)]
    lines += _notes(results)
    return "\n".join(lines)


def _notes(results: dict[str, Any]) -> list[str]:
    """What a reader needs besides the figures: flags, what was left out and why, and what the
    benchmark changed in kube-ddp."""
    points = results.get("scale", {}).get("kube-ddp", {}).get("scale", [])
    largest = (
        f" (its step from {points[-2]['jobs']:,} to {points[-1]['jobs']:,} jobs took "
        f"{points[-1]['wall_s'] / 60:.0f} min here)"
        if len(points) > 1
        else ""
    )
    per_job = (
        f" (it spent {1000 * (points[-1]['cpu_s']) / (points[-1]['jobs'] - points[-2]['jobs']):.0f}"
        " CPU-ms per job from the smaller scale size to the larger)"
        if len(points) > 1
        else ""
    )
    return [
        "### Notes",
        "",
        "- Flags. kube-ddp: `kube-ddp operator --namespace=NS` with its defaults (8 reconciles",
        "  at once, no client-side rate limit). MPI Operator v0.8.2 as",
        "  hack/devcluster/mpioperator.py runs it: `--kube-api-qps=50 --kube-api-burst=100",
        "  --threadiness=4` (its defaults, 5 requests/s, bursts of 10 and 2 workers, would",
        "  make the bursts wait for its own client). Training Operator v1.9.4",
        "  (hack/devcluster/peers.py): `--enable-scheme=pytorchjob --kube-api-qps=50",
        "  --kube-api-burst=100 --controller-threads=4` (defaults 20, 30 and 1). Both are built",
        "  from their Go modules (hack/devcluster/build.py) and run out of the cluster, their",
        "  CRDs read from the same modules.",
        "- The MPI Operator queues every event of a job through a rate limiter, by default",
        "  10 a second with bursts of 100 (`--controller-queue-rate-limit`,",
        "  `--controller-queue-burst`); a job makes several events (its pods, launcher Job,",
        "  status), so once the burst was spent each sequential job waited about a second",
        "  for it (apply p50 1.8 s in a first run). It is raised here to 1,000 a second,",
        "  bursts of 2,000, like its client's limit.",
        "- 10,000 jobs: kube-ddp only" + largest + "; the peers stop at 1,000, for the time it",
        "  takes on two shared cores (10,000 MPIJobs are 20,000 pods and 40,000 Services,",
        "  ConfigMaps, Secrets and Jobs). The restart: the MPI Operator's Lease is deleted before",
        "  it starts (it never releases it; the others run without leader election here).",
        "- What this benchmark changed in kube-ddp, from py-spy profiles of the operator during",
        "  the 1,000-job burst and the 10,000-job run (kopf's work per watch event was most of",
        "  its CPU, our reconcile about a tenth): kopf no longer builds a diff base for every",
        "  event (a deep copy of the object, for change handlers the operator does not have;",
        "  `handlers.NoDiffBase`), the pod indexes are async functions (kopf ran the plain",
        "  ones in a thread pool), and a job's children are created in two concurrent rounds",
        "  (Service, ServiceAccount and Role; then RoleBinding and pods) instead of one request",
        "  after another. `kubeddp_jobs_synced_total` (jobs reconciled since the start) was added",
        "  for the restart measure.",
        "- What is a limit of the design: one Python process running kopf decodes every watch",
        "  event of its jobs and pods and handles it on one thread, and cannot use a second",
        "  core: its throughput in a burst is bounded by what one core can do" + per_job + ".",
        "- Kubeflow Trainer v2 and JobSet are not in the table: they run out of cluster here",
        "  too, but each needs a Go build and webhook certificates of its own, and the Trainer",
        "  a TrainingRuntime; that was not done in the time of this change.",
        "",
    ]


def _goals(results: dict[str, Any], sizes: Sizes) -> list[str]:
    """The issue's goals, each with the figure of this run that it is about."""
    rows = []

    def ratio(found: dict[str, Any], field_: str) -> float | None:
        if "mpi-operator" not in found or "kube-ddp" not in found:
            return None
        return float(found["kube-ddp"][field_] / found["mpi-operator"][field_])

    for workers in sizes.apply_workers:
        found = results.get(f"apply{workers}", {})
        for field_ in ("p50_s", "p99_s"):
            value = ratio(found, field_)
            if value is not None:
                label = f"apply -> pods, {workers} workers, {field_[:3]}, kube-ddp / MPI Operator"
                rows.append((label, f"{value:.2f}x", "<= 1.0x", value <= 1.0))
    found = results.get(f"burst{max(sizes.bursts)}", {})
    value = ratio(found, "all_pods_s")
    if value is not None:
        label = f"burst {max(sizes.bursts):,} x {sizes.burst_workers}, kube-ddp / MPI Operator"
        rows.append((label, f"{value:.2f}x", "<= 1.0x", value <= 1.0))
    completion = results.get("completion", {})
    if "kube-ddp" in completion:
        ours = sum(completion["kube-ddp"]["requests_per_job"].values())
        for key, found in completion.items():
            if key != "kube-ddp":
                theirs = sum(found["requests_per_job"].values())
                label = f"API requests per lifecycle, kube-ddp / {results['contenders'][key]}"
                rows.append((label, f"{ours / theirs:.2f}x", "<= 1.0x", ours <= theirs))
    scale = results.get("scale", {}).get("kube-ddp")
    if scale:
        top = scale["scale"][-1]
        label = f"kube-ddp RSS with {top['jobs']:,} jobs"
        rows.append((label, f"{top['rss_mib']:.0f} MiB", "<= 300 MiB", top["rss_mib"] <= 300))
    if scale and "restart" in scale:
        restart = scale["restart"]
        label = f"kube-ddp re-sync of {restart['jobs']:,} jobs after a restart"
        rows.append((label, f"{restart['resync_s']:.1f} s", "<= 30 s", restart["resync_s"] <= 30))
    return [
        "| goal | this run | target | met |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {value} | {target} | {'yes' if met else 'no'} |"
            for label, value, target, met in rows
        ),
    ]


def _requests_section(
    results: dict[str, Any], completion: dict[str, Any], keys: list[str], sizes: Sizes
) -> list[str]:
    per_job = {k: v["requests_per_job"] for k, v in completion.items()}
    totals = {k: sum(v.values()) for k, v in per_job.items()}
    writes = {
        k: sum(c for name, c in v.items() if name.split()[0] not in ("GET", "LIST", "WATCH"))
        for k, v in per_job.items()
    }
    rows = _visible({name for v in per_job.values() for name in v}, per_job, 0.5)
    lines = [
        "### API server requests per job lifecycle",
        "",
        f"apiserver_request_total read before and after the {sizes.completion_jobs} jobs above",
        "went create -> Running -> Succeeded -> deleted, pods gone; less the benchmark client's",
        "own requests (it counts them) and the rate of the same controller idling for "
        f"{sizes.idle_s:g} s before",
        "(leases, heartbeats); divided by the jobs. The metric has no client label: the figures",
        "are all that a job's lifecycle cost the API server with this controller, its own",
        "requests and those of the scheduler, kwok and the controller manager (Job controller,",
        "garbage collector) caused by the objects it made.",
        "",
        *_header("requests per job", results),
        f"| all | {_cells(totals, keys, lambda x: f'{x:.1f}')} |",
        f"| writes (not GET, LIST, WATCH) | {_cells(writes, keys, lambda x: f'{x:.1f}')} |",
    ]
    for name in rows:
        values = {k: v.get(name, 0.0) for k, v in per_job.items()}
        lines.append(f"| {name} | {_cells(values, keys, lambda x: f'{x:.1f}')} |")
    lines += [
        "",
        "Rows under 0.5 for every controller are left out (the totals keep them); what is left",
        "of the idle rate after the subtraction is noise of either sign.",
        "",
        f"Goal: {GOALS['requests']}.",
        "",
    ]
    return lines


def _visible(names: set[str], counts: dict[str, dict[str, float]], least: float) -> list[str]:
    """The rows some contender has at least `least` of (what is left of the idle rate's
    subtraction is noise of either sign)."""
    return sorted(n for n in names if max(abs(c.get(n, 0.0)) for c in counts.values()) >= least)


def _scale_section(results: dict[str, Any], scale: dict[str, Any], keys: list[str]) -> list[str]:
    sizes_seen = sorted({p["jobs"] for v in scale.values() for p in v["scale"]})
    lines = [
        "### Controller memory and CPU with many jobs",
        "",
        "Jobs of one worker (an MPIJob: one worker and its launcher), created 8 at a time, "
        "whose pods",
        "stay Running on kwok nodes; the controller's resident memory (VmRSS) 5 s after the last",
        "pod ran, and the CPU seconds it used to get there (from its start, which for kube-ddp",
        "includes about a second of Python imports; for the larger size, from the smaller one,",
        "by the controller restarted in between).",
        "",
        *_header("", results),
    ]
    for jobs in sizes_seen:
        point = {
            k: next((p for p in v["scale"] if p["jobs"] == jobs), None) for k, v in scale.items()
        }
        rss = {k: p["rss_mib"] if p else None for k, p in point.items()}
        cpu = {k: p["cpu_s"] if p else None for k, p in point.items()}
        wall = {k: p["wall_s"] if p else None for k, p in point.items()}
        lines += [
            f"| {jobs:,} jobs: RSS | {_cells(rss, keys, lambda x: f'{x:.0f} MiB')} |",
            f"| {jobs:,} jobs: CPU seconds | {_cells(cpu, keys, lambda x: f'{x:.1f} s')} |",
            f"| {jobs:,} jobs: wall time to all Running | {_cells(wall, keys, seconds)} |",
        ]
    restart = {k: v["restart"] for k, v in scale.items() if "restart" in v}
    if not restart:
        return lines
    jobs = next(iter(restart.values()))["jobs"]
    lines += [
        "",
        f"Goal: {GOALS['scale']}. ![memory vs jobs]({PLOT_SCALE.name})",
        "",
        f"### Restart with {jobs:,} live jobs",
        "",
        "The controller stopped (SIGTERM) and started again; time from the new process's start",
        "until it had reconciled every job (kube-ddp: `kubeddp_jobs_synced_total`; MPI Operator:",
        "distinct jobs in its `Finished syncing job` log lines; Training Operator:",
        "`controller_runtime_reconcile_total` successes, which counts reconciles, not distinct "
        "jobs),",
        "and the API requests of that window (less the idle rate, without a controller).",
        "",
        *_header("", results),
        f"| re-sync time | {_cells({k: v['resync_s'] for k, v in restart.items()}, keys, seconds)}"
        " |",
        "| API requests | "
        + _cells(
            {k: sum(v["requests"].values()) for k, v in restart.items()}, keys, lambda x: f"{x:.0f}"
        )
        + " |",
    ]
    rows = _visible(
        {name for v in restart.values() for name in v["requests"]},
        {k: v["requests"] for k, v in restart.items()},
        5,
    )
    for name in rows:
        values = {k: v["requests"].get(name, 0.0) for k, v in restart.items()}
        lines.append(f"| {name} | {_cells(values, keys, lambda x: f'{x:.0f}')} |")
    lines += ["", f"Goal: {GOALS['restart']}.", ""]
    return lines


def plot(results: dict[str, Any], sizes: Sizes) -> None:
    """The latency distributions and memory against jobs, as PNGs next to BENCHMARKS.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    titles = results["contenders"]
    colors = {key: f"C{i}" for i, key in enumerate(titles)}  # one color per controller
    panels = [w for w in sizes.apply_workers if f"apply{w}" in results]
    if panels:
        figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
        for axis, workers in zip(axes[0], panels, strict=True):
            for key, found in results[f"apply{workers}"].items():
                ordered = sorted(found["samples"])
                fraction = [(i + 1) / len(ordered) for i in range(len(ordered))]
                axis.step(ordered, fraction, where="post", label=titles[key], color=colors[key])
            axis.set_xscale("log")
            axis.xaxis.set_minor_formatter(NullFormatter())
            axis.set_xlabel("apply -> all worker pods exist (s)")
            axis.set_ylabel("fraction of jobs")
            axis.set_title(f"{sizes.apply_jobs} jobs of {workers} workers")
            axis.grid(True, alpha=0.3)
            axis.legend()
        figure.tight_layout()
        figure.savefig(PLOT_LATENCY, dpi=90)
        plt.close(figure)
    if "scale" in results:
        figure, axis = plt.subplots(figsize=(5.5, 3.6))
        for key in titles:
            found = results["scale"].get(key, {"scale": []})
            xs = [p["jobs"] for p in found["scale"]]
            ys = [p["rss_mib"] for p in found["scale"]]
            axis.plot(xs, ys, marker="o", label=titles[key], color=colors[key])
        axis.set_xscale("log")
        axis.set_xlabel("jobs with pods Running")
        axis.set_ylabel("controller RSS (MiB)")
        axis.grid(True, alpha=0.3)
        axis.legend()
        figure.tight_layout()
        figure.savefig(PLOT_SCALE, dpi=90)
        plt.close(figure)


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def run(args: argparse.Namespace) -> str:
    """`python -m benchmarks operator [--peers]`: measure, plot, and the markdown section."""
    sizes = QUICK if args.quick else Sizes()
    chosen = list(CONTENDERS.values()) if args.peers else [CONTENDERS["kube-ddp"]]
    results = measure(OUT, sizes, chosen)
    command = "python -m benchmarks operator" + (
        " --peers (the operator part of `make bench`)" if args.peers else ""
    )
    results["command"] = command
    (OUT / "results.json").write_text(json.dumps(results, indent=1))
    if not args.quick and not args.no_write:
        plot(results, sizes)
    return render(results, sizes, command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--stage", action="append", choices=STAGES, help="default: all")
    parser.add_argument("--contender", action="append", choices=list(CONTENDERS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS",
        help="measure nothing: write the section of docs/BENCHMARKS.md and the plots from a "
        "results.json of an earlier run",
    )
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads(args.render.read_text())
        sizes = Sizes(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in results["sizes"].items()}
        )
        plot(results, sizes)
        replace_section(DOCUMENT, "operator", render(results, sizes, results["command"]))
        return 0
    sizes = QUICK if args.quick else Sizes()
    chosen = [CONTENDERS[k] for k in args.contender or CONTENDERS]
    results = measure(args.out, sizes, chosen, tuple(args.stage or STAGES))
    results["command"] = "python -m benchmarks.operator_bench " + " ".join(argv or sys.argv[1:])
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(render(results, sizes, results["command"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
