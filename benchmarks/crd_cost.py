"""What kube-ddp's CRD schema costs the API server per create: its CEL rules, its OpenAPI
schema, and neither.

Three CRDs of the same kind are installed side by side on the dev cluster's control plane (no
controller runs): `ddptrainingjobs.kubeddp.io` as shipped (manifests/crd.yaml), the same schema
without a single `x-kubernetes-validations` rule under the group `nocel.kubeddp.io`, and one
whose spec and status keep unknown fields with no schema at all under `noschema.kubeddp.io`.
Each round creates the same job (manifests/examples/digits-cpu.yaml, the demo) `--jobs` times
for each variant in turn, from CLIENTS threads, and reads the kube-apiserver process's CPU time
before and after; the jobs are deleted between batches. Medians over the rounds.

    python -m benchmarks crd [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from benchmarks.contenders import OUT
from benchmarks.markdown import Section, raw_note
from benchmarks.operator_measure import cpu_seconds
from benchmarks.trainer import machine_line
from tests.cluster.support import Cluster, fresh_namespace, load_dev_cluster

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "manifests" / "crd.yaml"
JOB = REPO / "manifests" / "examples" / "digits-cpu.yaml"
RESULTS = OUT / "crd-cost.json"
GROUP = "kubeddp.io"
PLURAL = "ddptrainingjobs"
VERSION = "v1alpha1"
CLIENTS = 4
JOBS, QUICK_JOBS = 300, 5
# variant -> its title in the report
VARIANTS = {
    "shipped": "as shipped (OpenAPI schema + CEL rules)",
    "nocel": "the same schema, no CEL rules",
    "noschema": "no schema (unknown fields kept)",
}


def group_of(variant: str) -> str:
    return GROUP if variant == "shipped" else f"{variant}.{GROUP}"


def without_rules(schema: Any) -> Any:
    """`schema` with every x-kubernetes-validations removed, at any depth."""
    if isinstance(schema, dict):
        return {k: without_rules(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if isinstance(schema, list):
        return [without_rules(item) for item in schema]
    return schema


def crd_variant(crd: dict[str, Any], variant: str) -> dict[str, Any]:
    """The shipped CRD as `variant`: its own group (and so name), its schema changed."""
    changed = copy.deepcopy(crd)
    if variant == "shipped":
        return changed
    group = group_of(variant)
    changed["metadata"]["name"] = f"{PLURAL}.{group}"
    changed["spec"]["group"] = group
    changed["spec"]["names"].pop("shortNames", None)  # taken by the shipped CRD
    changed["spec"]["names"].pop("categories", None)
    for version in changed["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        if variant == "nocel":
            version["schema"]["openAPIV3Schema"] = without_rules(schema)
        else:
            free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            schema["properties"] = {
                "spec": free,
                "status": free,
                **{k: v for k, v in schema["properties"].items() if k not in ("spec", "status")},
            }
            schema.pop("x-kubernetes-validations", None)
    return changed


def apiserver_pid() -> int:
    state = load_dev_cluster().running_state()
    if state is None:
        raise RuntimeError("the dev cluster is not running")
    return int(next(c["pid"] for c in state["components"] if c["name"] == "kube-apiserver"))


def create_batch(
    api: kubernetes.client.CustomObjectsApi, namespace: str, variant: str, jobs: int
) -> dict[str, Any]:
    """`jobs` creates of the demo job as `variant`: the API server's CPU and each latency."""
    body = yaml.safe_load(JOB.read_text())
    body["apiVersion"] = f"{group_of(variant)}/{VERSION}"
    batch = uuid.uuid4().hex[:5]

    def create(index: int) -> float:
        job = copy.deepcopy(body)
        job["metadata"] = {"name": f"{variant[:6]}-{batch}-{index}", "namespace": namespace}
        started = time.perf_counter()
        api.create_namespaced_custom_object(group_of(variant), VERSION, namespace, PLURAL, job)
        return time.perf_counter() - started

    pid = apiserver_pid()
    cpu_from, wall_from = cpu_seconds([pid]), time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        latencies = list(pool.map(create, range(jobs)))
    wall = time.perf_counter() - wall_from
    cpu = cpu_seconds([pid]) - cpu_from
    api.delete_collection_namespaced_custom_object(group_of(variant), VERSION, namespace, PLURAL)
    return {"jobs": jobs, "cpu_s": cpu, "wall_s": wall, "latencies_s": latencies}


def measure(repeats: int, jobs: int) -> dict[str, Any]:
    """`repeats` rounds of one batch per variant, the order turned each round."""
    dev_cluster = load_dev_cluster()
    started_here = dev_cluster.running_state() is None
    state = dev_cluster.up(owner="bench")
    kubeconfig = Path(state["kubeconfig"])
    crd = yaml.safe_load(CRD.read_text())
    files = []
    for variant in VARIANTS:
        path = OUT / f"crd-{variant}.yaml"
        OUT.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(crd_variant(crd, variant)))
        files.append(path)
    names = [f"{PLURAL}.{group_of(variant)}" for variant in VARIANTS]
    results: dict[str, Any] = {"jobs": jobs, "clients": CLIENTS, "load": [], "batches": []}
    started = time.monotonic()
    try:
        dev_cluster.controlplane.apply_crds(files, names, kubeconfig)
        cluster = Cluster.of_dev_cluster(state)
        api = cluster.custom_objects
        with fresh_namespace(cluster, f"bench-crd-{uuid.uuid4().hex[:5]}") as namespace:
            create_batch(api, namespace, "shipped", min(jobs, 20))  # warm: caches, CEL programs
            order = list(VARIANTS)
            for round_ in range(repeats):
                for variant in order[round_ % len(order) :] + order[: round_ % len(order)]:
                    results["load"].append(os.getloadavg()[0])
                    batch = create_batch(api, namespace, variant, jobs)
                    results["batches"].append({"variant": variant, **batch})
                    per_create = 1000 * batch["cpu_s"] / jobs
                    print(f"crd cost [{round_ + 1}/{repeats}] {variant}: {per_create:.2f} ms "
                          f"API-server CPU a create", file=sys.stderr, flush=True)  # fmt: skip
        cluster.api.close()
    finally:
        for name in names[1:]:
            dev_cluster.controlplane.kubectl("delete", "crd", name, "--ignore-not-found",
                                             kubeconfig=kubeconfig)  # fmt: skip
        if started_here:
            dev_cluster.down()
    results["minutes"] = (time.monotonic() - started) / 60
    return results


def summary(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per variant: API-server CPU ms per create (median of batches), create latency p50 and
    p95 ms (all creates), creates per second (median of batches)."""
    found = {}
    for variant in VARIANTS:
        batches = [b for b in results["batches"] if b["variant"] == variant]
        if not batches:
            continue
        latencies = sorted(s for b in batches for s in b["latencies_s"])
        found[variant] = {
            "cpu_ms": statistics.median(1000 * b["cpu_s"] / b["jobs"] for b in batches),
            "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p95_ms": 1000 * latencies[int(len(latencies) * 0.95)],
            "per_s": statistics.median(b["jobs"] / b["wall_s"] for b in batches),
            "batches": len(batches),
        }
    return found


def render(results: dict[str, Any]) -> str:
    found = summary(results)
    base = found.get("nocel", {}).get("cpu_ms")
    rows = []
    for variant, row in found.items():
        ratio = f"{row['cpu_ms'] / base:.2f}" if base else "-"
        rows.append(
            f"| {VARIANTS[variant]} | {row['cpu_ms']:.2f} | {ratio} | {row['p50_ms']:.1f} "
            f"| {row['p95_ms']:.1f} | {row['per_s']:.0f} | {row['batches']} |"
        )
    return "\n".join(
        [
            "## What the CRD's schema costs per create",
            "",
            f"Command: `python -m benchmarks crd` (part of `make bench`). {raw_note('crd')}",
            "",
            machine_line(
                "the dev cluster's control plane (one kube-apiserver, one etcd) on it",
                results["load"],
                "batch",
                results.get("minutes", 0),
            ),
            "",
            f"Each batch creates the demo job (`{JOB.relative_to(REPO)}`) {results['jobs']} "
            f"times from {results['clients']} client threads against one CRD variant, the "
            "variants in turn, the order rotated each round; API-server CPU is the "
            "kube-apiserver process's user + system time over the batch, divided by the "
            "creates. No controller runs.",
            "",
            "| CRD | API-server CPU a create (ms, median) | / no CEL | create p50 (ms) "
            "| create p95 (ms) | creates/s (median) | batches |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
        ]
    )


def run(args: argparse.Namespace) -> Section:
    """`python -m benchmarks crd`."""
    results = measure(1 if args.quick else args.repeats, QUICK_JOBS if args.quick else JOBS)
    if not args.quick:
        RESULTS.write_text(json.dumps(results, indent=1))
    return Section(render(results), results)
