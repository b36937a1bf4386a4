"""The job's NetworkPolicy, enforced: on the real node, kube-router's firewall (built from its Go
module, iptables and ipset, no image of its own) holds a job's rendezvous port shut to another
job's pod and open to the job's own.

The operator is the chart's when an earlier test installed it, else a process here (the cluster
tier's way): what is under test is the policy it creates and real pods' connections. Whatever
kube-router adds to the host (iptables chains, ipsets) its own `--cleanup-config` removes, and
the test checks that none is left.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.cluster.operator_support import Jobs, job_manifest, running_operator
from tests.cluster.support import (
    ChildProcess,
    Cluster,
    fresh_namespace,
    load_dev_cluster,
    wait_for,
)
from tests.e2e.conftest import EXTERNAL_KUBECONFIG, OPERATOR_NAMESPACE, RELEASE
from tests.e2e.platform import _merge, dev_job_overrides

if os.environ.get(EXTERNAL_KUBECONFIG):  # before `cluster` would start the dev cluster
    pytest.skip(
        "kube-router's firewall runs beside the dev cluster's real node only",
        allow_module_level=True,
    )

PORT = 29500
# Worker 0 listens on the rendezvous port. Another pod of the job connects to it once a
# second, for good, saying each time whether it got in; a pod given an address (argv[1])
# tries it for 20 s and exits 0 when it got in, 3 when it did not.
PROGRAM = f"""
import os, socket, sys, time
def connect(target):
    try:
        socket.create_connection((target, {PORT}), timeout=2).close()
        print("connected", flush=True)
        return True
    except OSError as error:
        print("no connection:", error, flush=True)
        return False
if len(sys.argv) == 1 and os.environ["RANK"] == "0":
    server = socket.create_server(("", {PORT}))
    while True:
        server.accept()[0].close()
if len(sys.argv) == 1:
    while True:
        connect(os.environ["MASTER_ADDR"])
        time.sleep(1)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    if connect(sys.argv[1]):
        sys.exit(0)
    time.sleep(1)
sys.exit(3)
"""


def host_state() -> str:
    """kube-router's marks on the host: its iptables chains and rules, its ipsets."""
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    sets = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=True)
    ours = [line for line in rules.splitlines() if "KUBE-ROUTER" in line or "KUBE-POD-FW" in line]
    ours += [line for line in rules.splitlines() if "KUBE-NWPLCY" in line]
    ours += [name for name in sets.stdout.split() if name.startswith("KUBE-")]
    return "\n".join(ours)


class KubeRouter(ChildProcess):
    def __init__(self, binary: Path, argv: list[str], log_path: Path) -> None:
        self.binary = binary
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(binary), *argv], stdout=log, stderr=subprocess.STDOUT
            )


class Firewall:
    """kube-router's NetworkPolicy firewall for the real node, and nothing else of it: started
    by the test when it wants the policies enforced."""

    def __init__(self, binary: Path, kubeconfig: Path, node_name: str, log_path: Path) -> None:
        self.binary = binary
        self.argv = [
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={node_name}",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--enable-cni=false",
            "--health-port=0",
        ]
        self.log_path = log_path
        self.router: KubeRouter | None = None

    def start(self) -> None:
        self.router = KubeRouter(self.binary, self.argv, self.log_path)
        # its chain for each pod it guards (KUBE-POD-FW-...): the policies are in force
        wait_for(lambda: "KUBE-POD-FW" in host_state(), "kube-router's firewall", 60)

    def clean_up(self) -> None:
        if self.router is not None:
            self.router.stop()
            print("---- kube-router log ----\n" + self.router.log()[-4000:])
        subprocess.run([str(self.binary), "--cleanup-config"], capture_output=True, check=False)


@pytest.fixture
def real_node(cluster: Cluster, crd: None) -> dict[str, Any]:
    """The dev cluster's real node up; what puts a job's pods on it."""
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, the kubelet, iptables)")
    dev_cluster = load_dev_cluster()
    try:
        dev_cluster.node.up()
    except dev_cluster.ClusterError as error:
        pytest.fail(f"the real node did not come up: {error}", pytrace=False)
    return dev_job_overrides()


@pytest.fixture
def firewall(cluster: Cluster, real_node: dict[str, Any], tmp_path: Path) -> Iterator[Firewall]:
    dev_cluster = load_dev_cluster()
    dev_cluster.packages.ensure([dev_cluster.packages.NETWORK_POLICY])
    binary = dev_cluster.build.built("kube-router")
    assert host_state() == "", "kube-router's marks are on the host already"
    firewall = Firewall(binary, cluster.kubeconfig, dev_cluster.node.NODE_NAME, tmp_path / "kr.log")
    try:
        yield firewall
    finally:
        firewall.clean_up()
        assert host_state() == "", "kube-router left marks on the host"


def connecting_job(
    overrides: dict[str, Any], name: str, nodes: int, *target: str
) -> dict[str, Any]:
    spec = {
        "nodes": nodes,
        "port": PORT,
        "command": ["python3", "-c", PROGRAM, *target],
        "runPolicy": {"restartPolicy": "Never"},
    }
    return job_manifest(name, **_merge(overrides, spec))


def exit_code(jobs: Jobs, pod_name: str) -> int | None:
    try:
        pod = jobs.cluster.core.read_namespaced_pod(pod_name, jobs.namespace)
    except kubernetes.client.ApiException:  # not created yet
        return None
    for status in pod.status.container_statuses or []:
        if status.state.terminated is not None:
            return int(status.state.terminated.exit_code)
    return None


def operator_for(jobs: Jobs, tmp_path: Path) -> AbstractContextManager[object]:
    """The chart's operator when an earlier test of the session installed it (it watches every
    namespace: a second one would race it), else `kube-ddp operator` as a process here."""
    apps = kubernetes.client.AppsV1Api(jobs.cluster.api)
    try:
        apps.read_namespaced_deployment(RELEASE, OPERATOR_NAMESPACE)
    except kubernetes.client.ApiException:
        return running_operator(jobs.cluster, jobs.namespace, tmp_path)
    return nullcontext()


def test_only_the_jobs_own_pods_reach_its_rendezvous(
    cluster: Cluster, real_node: dict[str, Any], firewall: Firewall, tmp_path: Path
) -> None:
    """Before the firewall runs, another job's pod gets in (so the test can see a connection);
    once it runs, another job's pod is kept out and the job's own pod still gets in."""
    with fresh_namespace(cluster, f"e2e-netpol-{uuid.uuid4().hex[:5]}") as namespace:
        jobs = Jobs(cluster, namespace)
        enforced(jobs, real_node, firewall, tmp_path)


def enforced(jobs: Jobs, overrides: dict[str, Any], firewall: Firewall, tmp_path: Path) -> None:
    rendezvous = f"a-worker-0.a.{jobs.namespace}.svc"

    def finished(pod: str) -> int | None:
        wait_for(lambda: exit_code(jobs, pod) is not None, f"{pod} to end", 120)
        return exit_code(jobs, pod)

    def lines(pod: str) -> list[str]:
        try:
            log = jobs.cluster.core.read_namespaced_pod_log(pod, jobs.namespace)
        except kubernetes.client.ApiException:  # not created, or not started yet
            return []
        return str(log).splitlines()

    with operator_for(jobs, tmp_path):
        jobs.create(connecting_job(overrides, "a", 2))
        wait_for(lambda: "connected" in lines("a-worker-1"), "a's worker 1 to connect", 120)
        jobs.create(connecting_job(overrides, "unguarded", 1, rendezvous))
        assert finished("unguarded-worker-0") == 0, "no connection even without a firewall"
        firewall.start()
        jobs.create(connecting_job(overrides, "b", 1, rendezvous))
        code = finished("b-worker-0")
        assert code == 3, "another job's pod got in:\n" + "\n".join(lines("b-worker-0"))
        # The job's own pod still gets in: its tries go on connecting. (A try may miss its DNS
        # answer while kube-router rewrites its rules after a pod comes or goes: that is no
        # refusal at the port.)
        before = len(lines("a-worker-1"))
        wait_for(
            lambda: (
                len(tries := lines("a-worker-1")) >= before + 3 and tries[-3:] == ["connected"] * 3
            ),
            "3 more connections of a's worker 1",
        )
        at_the_port = [t for t in lines("a-worker-1")[before:] if "name resolution" not in t]
        assert set(at_the_port) == {"connected"}, "the job's own pod was kept out"
