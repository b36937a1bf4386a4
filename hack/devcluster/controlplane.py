"""The control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and kwok
with its fake nodes and their pods' remover (`devcluster.pod_remover`), as processes on
127.0.0.1 on free ports; `up`, `down` and what they record in .cluster/state.json. The real
node (`devcluster.node`) is added on top."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

from devcluster.build import binary, build_all
from devcluster.paths import (
    HACK,
    KUBECONFIG,
    LOGS,
    PKI,
    RUN,
    STATE_DIR,
    STATE_FILE,
    ClusterError,
    log,
)
from devcluster.pki import make_pki, write_kubeconfig
from devcluster.pod_remover import KUBELET_STOPPED, KWOK_NODE
from devcluster.processes import (
    Component,
    http_get,
    is_alive,
    is_healthy,
    spawn,
    start_until_up,
    stop_component,
    tls_context,
    wait_until,
)

# Ports handed to components are picked from here up to the kernel's ephemeral range.
LOWEST_PICKED_PORT = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


# Every port this process has handed out: a component binds its ports only once started, so
# a port picked for one is still free when the next is picked (Kueue's health and metrics
# servers were once given the same one: `bind: address already in use`).
_handed: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a component that binds it later, and never one this
    process handed out before. Below the kernel's ephemeral range: a port the kernel picks (a
    bind to 0) is one that an outgoing connection can take meanwhile (kwok, started last, once
    found its port held by one: `address already in use`); ports below the range are only ever
    taken by a listener."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    tries = 100 if ephemeral_low - LOWEST_PICKED_PORT >= 1000 else 0
    for _ in range(tries):
        port = random.randrange(LOWEST_PICKED_PORT, ephemeral_low)
        if port not in _handed and _bindable(port):
            _handed.add(port)
            return port
    for _ in range(100):  # no room below the range, or none free: the kernel picks
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in _handed:
            _handed.add(port)
            return port
    raise ClusterError("no free port on 127.0.0.1 that this process has not handed out")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# Kubernetes' own gang scheduling (alpha in 1.36): the scheduling.k8s.io/v1alpha2 Workload and
# PodGroup API, pods' spec.schedulingGroup, and kube-scheduler's GangScheduling plugin.
GANG_FEATURE_GATES = "--feature-gates=GenericWorkload=true,GangScheduling=true"


def selector(annotations: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in annotations.items())


def component_commands(ports: dict[str, int]) -> dict[str, list[str]]:
    """The command line of each component, in start order."""
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    kwok_stages = RUN / "kwok-stages.yaml"

    def delegated_auth(name: str) -> list[str]:
        kubeconfig = str(RUN / f"{name}.kubeconfig")
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports[name]}",
            f"--cert-dir={RUN / name}",
            "--leader-elect=false",
            # No front proxy here: do not look up its CA (it only logs errors when missing).
            "--authentication-skip-lookup=true",
        ]

    return {
        "etcd": [
            str(binary("etcd")),
            "--name=kube-ddp-dev",
            f"--data-dir={STATE_DIR / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kube-ddp-dev={peer_url}",
            "--unsafe-no-fsync",  # throwaway data: no need to wait for the disk
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(binary("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-apiserver']}",
            # Loopback only; "none" because the endpoints reconciler rejects loopback addresses.
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={PKI / 'apiserver.crt'}",
            f"--tls-private-key-file={PKI / 'apiserver.key'}",
            f"--client-ca-file={PKI / 'ca.crt'}",
            f"--cert-dir={RUN / 'kube-apiserver'}",
            "--authorization-mode=RBAC",
            # The real node's kubelet is reached at its address (for logs, exec): its name
            # resolves nowhere.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={PKI / 'sa.pub'}",
            f"--service-account-signing-key-file={PKI / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",  # lighter; no tenants to protect here
            "--profiling=false",
            GANG_FEATURE_GATES,
            "--runtime-config=scheduling.k8s.io/v1alpha2=true",
        ],
        "kube-controller-manager": [
            str(binary("kube-controller-manager")),
            *delegated_auth("kube-controller-manager"),
            "--controllers=*",  # garbage collector, namespace, serviceaccount(-token), job, ...
            "--use-service-account-credentials=true",  # each controller its own identity
            f"--root-ca-file={PKI / 'ca.crt'}",
            f"--service-account-private-key-file={PKI / 'sa.key'}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--profiling=false",
            GANG_FEATURE_GATES,  # its podgroup-protection controller
        ],
        "kube-scheduler": [
            str(binary("kube-scheduler")),
            *delegated_auth("kube-scheduler"),
            "--profiling=false",
            GANG_FEATURE_GATES,
        ],
        "kwok": [
            str(binary("kwok")),
            f"--kubeconfig={RUN / 'kwok.kubeconfig'}",
            f"--config={kwok_stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={selector(KWOK_NODE)}",
            f"--disregard-status-with-annotation-selector={selector(KUBELET_STOPPED)}",
            "--cidr=10.244.0.0/16",  # fake pod IPs: nothing routes to them
            "--node-ip=10.0.0.1",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-lease-duration-seconds=40",  # kwok renews node leases: nodes stay Ready
        ],
        # kwok's nodes' kubelet removes a deleted pod by uid (kwok runs without pod-delete).
        "pod-remover": [
            sys.executable,
            str(Path(__file__).with_name("pod_remover.py")),
            f"https://127.0.0.1:{ports['kube-apiserver']}",
            str(PKI),
        ],
    }


class State(TypedDict):
    """What .cluster/state.json records about a running cluster."""

    owner: str  # "cli" or "pytest": a test session stops only a cluster a test session started
    server: str
    kubeconfig: str
    ports: dict[str, int]
    components: list[Component]


def read_state() -> State | None:
    try:
        state: State = json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None
    return state


def running_state() -> State | None:
    """The recorded state when every recorded process still runs, else None."""
    state = read_state()
    if state and state["components"] and all(is_alive(c) for c in state["components"]):
        return state
    return None


def stop_processes(state: State | None, grace: float = 15.0) -> None:
    """Stop what `up` recorded, newest first, each before the next: the apiserver shuts down
    cleanly only while etcd still runs. SIGTERM, then SIGKILL after `grace` seconds."""
    if not state:
        return
    for component in reversed(state["components"]):
        stop_component(component, grace)


def restart_apiserver() -> float:
    """Stop kube-apiserver and start it again with the same flags (resilience tests), then
    kube-scheduler; the seconds the server was unavailable."""
    with state_lock():
        state = running_state()
        if state is None:
            raise ClusterError("the cluster is not running")
        component = next(c for c in state["components"] if c["name"] == "kube-apiserver")
        started = time.monotonic()
        stop_component(component)
        process = spawn(component["name"], component["argv"])
        component["pid"] = process.pid
        STATE_FILE.write_text(json.dumps(state, indent=2))
        check = functools.partial(is_healthy, f"{state['server']}/readyz", tls_context())
        wait_until("kube-apiserver /readyz", check, 60, {component["name"]: process})
        unavailable = time.monotonic() - started
        # kube-scheduler's informers, refused by RBAC while the server starts, can leave it
        # scheduling nothing until it is started again (kubernetes/kubernetes#119967; seen here
        # once in three restarts): started again once the server is ready.
        scheduler = next(c for c in state["components"] if c["name"] == "kube-scheduler")
        stop_component(scheduler)
        scheduler["pid"] = spawn(scheduler["name"], scheduler["argv"]).pid
        STATE_FILE.write_text(json.dumps(state, indent=2))
        return unavailable


def log_says(path: Path, words: str) -> bool:
    try:
        return words in path.read_text(errors="replace")
    except OSError:
        return False


def api_json(server: str, path: str) -> Any:
    status, body = http_get(server + path, tls_context())
    return json.loads(body) if status == 200 else None


def nodes_ready(server: str, expected: int) -> bool:
    nodes = api_json(server, "/api/v1/nodes?labelSelector=type%3Dkwok")
    if not nodes:
        return False
    ready = [
        node
        for node in nodes["items"]
        for condition in node.get("status", {}).get("conditions", [])
        if condition["type"] == "Ready" and condition["status"] == "True"
    ]
    return len(ready) == expected


def clean_state_dir() -> None:
    """Remove what a previous run left, keeping the lock files that coordinate users."""
    STATE_DIR.mkdir(exist_ok=True)
    for entry in STATE_DIR.iterdir():
        if entry.suffix == ".lock":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    STATE_DIR.mkdir(exist_ok=True)
    with open(STATE_DIR / "state.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def up(owner: str = "cli") -> State:
    """Start the cluster, or return the running one's state. Idempotent."""
    build_all()
    with state_lock():
        state = running_state()
        if state:
            return state
        stop_processes(read_state())  # a half-dead earlier run: stop its survivors
        clean_state_dir()
        return start_cluster(owner)


# kwok v0.8.0 can die as it starts: its node controller's workers initialise their stages at
# once, and the CEL registry they share is a plain map (easycel's registerTraits), so Go stops
# it with "fatal error: concurrent map writes" (one start in four, seen here). A new start
# races anew, and mostly wins.
KWOK_START_RACE = "concurrent map writes"
KWOK_STARTS = 4


def start_cluster(owner: str) -> State:
    started = time.monotonic()
    for directory in (RUN, LOGS, STATE_DIR / "bin"):
        directory.mkdir(parents=True)
    make_pki(PKI)
    names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ports = {name: free_port() for name in (*names, "kwok")}
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    write_kubeconfig(KUBECONFIG, server, "admin")
    for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
        write_kubeconfig(RUN / f"{name}.kubeconfig", server, name)
    stage_files = [*sorted(binary("kwok").parent.glob("*.yaml")), HACK / "kwok-stages.yaml"]
    (RUN / "kwok-stages.yaml").write_text("\n---\n".join(f.read_text() for f in stage_files))
    for tool in ("kubectl", "helm"):
        (STATE_DIR / "bin" / tool).symlink_to(binary(tool))

    commands = component_commands(ports)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    state: State = {
        "owner": owner,
        "server": server,
        "kubeconfig": str(KUBECONFIG),
        "ports": ports,
        "components": [],
    }

    def start(name: str) -> None:
        processes[name] = spawn(name, commands[name])
        # Record each process at once, so a failed start can still be cleaned up.
        state["components"].append(
            {"name": name, "pid": processes[name].pid, "argv": commands[name]}
        )
        STATE_FILE.write_text(json.dumps(state, indent=2))

    try:
        start("etcd")
        etcd_health = f"http://127.0.0.1:{ports['etcd']}/health"
        wait_until("etcd", functools.partial(is_healthy, etcd_health), 30, processes)
        start("kube-apiserver")
        check = functools.partial(is_healthy, f"{server}/readyz", tls_context())
        wait_until("kube-apiserver /readyz", check, 60, processes)
        kubectl("create", "-f", str(HACK / "nodes.yaml"))
        for name in ("kube-controller-manager", "kube-scheduler"):
            start(name)
        expected_nodes = (HACK / "nodes.yaml").read_text().count("\nkind: Node")

        def start_kwok() -> subprocess.Popen[bytes]:
            state["components"] = [c for c in state["components"] if c["name"] != "kwok"]
            start("kwok")
            return processes["kwok"]

        def kwok_up(kwok: subprocess.Popen[bytes]) -> None:
            kwok_health = f"http://127.0.0.1:{ports['kwok']}/healthz"
            wait_until("kwok", functools.partial(is_healthy, kwok_health), 60, {"kwok": kwok})
            ready = functools.partial(nodes_ready, server, expected_nodes)
            wait_until(f"{expected_nodes} Ready nodes", ready, 60, {"kwok": kwok})

        start_until_up("kwok", start_kwok, kwok_up, KWOK_START_RACE, KWOK_STARTS)
        start("pod-remover")
        watching = functools.partial(log_says, LOGS / "pod-remover.log", "watching pods")
        wait_until("pod-remover", watching, 30, processes)
        unverified = tls_context(verify=False)
        for name in ("kube-controller-manager", "kube-scheduler"):
            check = functools.partial(
                is_healthy, f"https://127.0.0.1:{ports[name]}/healthz", unverified
            )
            wait_until(name, check, 60, {name: processes[name]})
        # The serviceaccount controller has caught up once `default` has its ServiceAccount:
        # before that, pods are refused admission.
        wait_until(
            "the default ServiceAccount",
            lambda: api_json(server, "/api/v1/namespaces/default/serviceaccounts/default"),
            60,
            processes,
        )
    except BaseException:
        stop_processes(state)
        raise
    log(f"cluster ready in {time.monotonic() - started:.1f} s: {server}")
    return state


def kubectl(
    *args: str, stdin: str | None = None, kubeconfig: Path = KUBECONFIG, check: bool = True
) -> str:
    result = subprocess.run(
        [str(binary("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if check and result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def apply_crds(files: Sequence[Path], names: Sequence[str], kubeconfig: Path = KUBECONFIG) -> None:
    """Apply CRDs read from a module, server-side (some are too large for the last-applied
    annotation), and wait until the CRDs `names` are established."""
    kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        *(f"--filename={f}" for f in files),
        kubeconfig=kubeconfig,
    )
    listed = [f"crd/{name}" for name in names]

    # Polled: `kubectl wait` (and a jsonpath filter) fail outright while a new CRD has no
    # conditions yet.
    def established() -> bool:
        got = json.loads(kubectl("get", *listed, "--output=json", kubeconfig=kubeconfig))
        crds = got.get("items", [got])  # one name gives the object itself, not a List
        return all(
            any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
            for crd in crds
            for conditions in [crd.get("status", {}).get("conditions") or []]
        )

    wait_until(f"the CRDs {', '.join(names)} to be established", established, 60, {})


def down() -> bool:
    """Stop what `up` started; True when something was running."""
    with state_lock():
        state = read_state()
        was_running = bool(state and any(is_alive(c) for c in state["components"]))
        stop_processes(state)
        with contextlib.suppress(FileNotFoundError):
            STATE_FILE.unlink()
    return was_running
