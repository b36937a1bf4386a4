"""The operator benchmark's measurements (the stages of `benchmarks.operator_bench`): each
contender in turn on the dev cluster, its figures as a dict that `operator_report` writes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes

from benchmarks.contenders import REPO, STAGES, Contender, Running, devcluster_processes
from kube_ddp.names import GROUP, PLURAL
from tests.cluster.support import load_dev_cluster


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


def in_phase(phase: str, key: Callable[[Any], str] = pod_name) -> Callable[[Any], str | None]:
    """A Watcher's key: the pod's `key` once it is in `phase`."""
    return lambda pod: key(pod) if pod.status.phase == phase else None


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


def cpu_seconds(pids: Iterable[int]) -> float:
    """The CPU time the processes used so far, together."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def rss_mib(pids: Iterable[int], field: str = "VmRSS") -> float:
    """The processes' resident memory now, or their peaks with `field="VmHWM"`, together."""
    total = 0.0
    for pid in pids:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        found = [int(line.split()[1]) for line in lines if line.startswith(f"{field}:")]
        if not found:
            raise RuntimeError(f"no {field} for pid {pid}")
        total += found[0] / 1024
    return total


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
        contender.create(self.api, namespace, name, workers)

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
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=contender.pod_key)
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
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=contender.pod_key)
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
        self,
        contender: Contender,
        namespace: str,
        names: list[str],
        workers: int,
        statuses: bool = False,
    ) -> None:
        """Create jobs `names` and wait until their pods run; with `statuses`, until each
        job's own status says so too (the controller has digested every pod event)."""
        running = Watcher(
            self.core.list_namespaced_pod, namespace, key=in_phase("Running", contender.pod_key)
        )
        said = None
        if statuses:
            said = self.job_watcher(
                contender,
                namespace,
                lambda job: str(job["metadata"]["name"]) if contender.says_running(job) else None,
            )
        try:
            self.create_many(contender, namespace, names, workers)
            wanted = {p for n in names for p in contender.worker_pods(n, workers)}
            running.wait(wanted, timeout=3600)
            if said is not None:
                said.wait(set(names), timeout=3600)
        finally:
            running.stop()
            if said is not None:
                said.stop()

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
        pods = Watcher(self.core.list_namespaced_pod, namespace, key=in_phase("Succeeded"))
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
                finishers[name] = ended = contender.finishers(self.core, namespace, name)
                if contender.lists_finishers:
                    client[("LIST", "pods")] += 1
                body = {"metadata": {"annotations": {"sim.kubeddp.io/exit-code": "0"}}}
                for pod in ended:
                    self.core.patch_namespaced_pod(pod, namespace, body)
                    client[("PATCH", "pods")] += 1
                finished.wait({name}, timeout=60)
            pods.wait({p for ended in finishers.values() for p in ended}, timeout=60)
            samples = [
                finished.first_seen[n] - max(pods.first_seen[p] for p in finishers[n])
                for n in names
            ]
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
            self.run_to_running(contender, namespace, names, 1, statuses=True)
            time.sleep(5)  # queues drain
            point = {
                "jobs": jobs,
                "rss_mib": rss_mib(running.pids),
                "cpu_s": cpu_seconds(running.pids) - cpu_from,
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
                cpu = cpu_seconds(running.pids)
                time.sleep(3)  # what it does right after its last first reconcile
                requests = window.stop()
                found["restart"] = {"jobs": sizes[0], "resync_s": resync, "cpu_s": cpu,
                    "rss_mib": rss_mib(running.pids), "requests": _keyed(requests)}  # fmt: skip
                save()
                print(f"  {contender.key} restart: {resync:.1f} s", flush=True)
                for before, jobs in itertools.pairwise(sizes):
                    grow(running, before, jobs, cpu_seconds(running.pids))


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


def apply_our_crd(kubeconfig: str | Path) -> None:
    """The DDPTrainingJob CRD as shipped, established."""
    crd = REPO / "manifests" / "crd.yaml"
    load_dev_cluster().controlplane.apply_crds([crd], [f"{PLURAL}.{GROUP}"], Path(kubeconfig))


def _measure(
    kubeconfig: str, out: Path, sizes: Sizes, contenders: list[Contender], stages: tuple[str, ...]
) -> dict[str, Any]:
    bench = Bench(kubeconfig, out)
    apply_our_crd(kubeconfig)
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

    def running(stage: str) -> list[Contender]:
        return [c for c in contenders if stage in c.stages]

    if "apply" in stages:
        for workers in sizes.apply_workers:
            for contender in running("apply"):
                stage(f"apply {sizes.apply_jobs} x {workers} workers", contender)
                with bench.contender(contender, f"apply{workers}") as (namespace, _):
                    found = bench.apply(contender, namespace, sizes.apply_jobs, workers)
                results.setdefault(f"apply{workers}", {})[contender.key] = found
                save()
    if "completion" in stages:
        for contender in running("completion"):
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
            for contender in running("burst"):
                stage(f"burst {jobs} x {sizes.burst_workers}", contender)
                with bench.contender(contender, f"burst{jobs}") as (namespace, _):
                    found = bench.burst(contender, namespace, jobs, sizes.burst_workers)
                results.setdefault(f"burst{jobs}", {})[contender.key] = found
                save()
                print(f"  {json.dumps(found)}", flush=True)
    if "scale" in stages:
        idle = idle_rate(sizes.idle_s)
        # kube-ddp last: its largest size takes longest (a quarter of an hour for 10,000).
        scaled = running("scale")
        for contender in [*scaled[1:], scaled[0]]:
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
