"""One REAL node for the dev cluster: containerd, runc and the CNI bridge from Debian, a kubelet
and CoreDNS built from their Go modules, images made here (devcluster.images).

It is one per machine (a bridge, an iptables rule and a node name are machine-wide), recorded
in NODE_DIR/node.json with what it changed on the host (devcluster.host), so that `down`, or
the next `up` after a crash, leaves the host as it was found.

Network: the pods' bridge `cni0` is 10.88.0.1/16 and everything the node serves listens
there: the kubelet (its InternalIP) and CoreDNS (the pods' cluster DNS). Pods reach the API
server, which listens on 127.0.0.1 only, at `kubernetes.default.svc` (10.96.0.1:443) through
one DNAT rule; its certificate names that address, so TLS verifies.

The node is labelled `kubeddp.io/real=true` and tainted `kubeddp.io/real-node=true:NoSchedule`:
only pods meant for it land there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, TypedDict

from devcluster import images, packages
from devcluster.build import build_all, built
from devcluster.controlplane import State, api_json, kubectl, running_state
from devcluster.host import HostRecord, read_sysctl, require_root, write_sysctl
from devcluster.paths import PKI, STATE_DIR, ClusterError, log, machine_lock
from devcluster.pki import new_certificate, write_kubeconfig
from devcluster.processes import Component, is_alive, run, spawn_to, stop_component, wait_until

NODE_NAME = "real-node-0"
# What the node runs beside the control plane (add-on builds: a cluster of kwok nodes needs
# neither).
NODE_BINARIES = ("kubelet", "coredns")
NODE_LABEL = ("kubeddp.io/real", "true")
NODE_TAINT = "kubeddp.io/real-node"
NODE_DIR = Path("/var/lib/kube-ddp-node")
RUN_DIR = Path("/run/kube-ddp-node")  # sockets: short paths (108 bytes at most)
SOCKET = RUN_DIR / "containerd.sock"
RECORD = NODE_DIR / "node.json"
# The node joins one cluster: this clone's, or its second (KUBEDDP_STATE_DIR); the other
# cluster's teardown must leave it be.
THIS_CLUSTER = str(STATE_DIR)
BRIDGE, GATEWAY, POD_CIDR = "cni0", "10.88.0.1", "10.88.0.0/16"
# A bridge whose address was never set takes the lowest of its ports' addresses: a pod
# deleted can change it, and the other pods' frames to the gateway (DNS, the API server) go
# to the old address, lost until their ARP entry expires (20 to 30 s). A set address stays.
BRIDGE_MAC = "02:6b:64:64:70:01"  # locally administered
# Another cluster's test session holds the node this long at most (its e2e tier).
OTHER_NODE_WAIT = 1800.0
API_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: the first address of the range
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins (packages.REAL_NODE)


class NodeRecord(TypedDict):
    cluster: str  # the state directory of the cluster the node joined
    components: list[Component]
    host: dict[str, Any]


def ctr() -> list[str]:
    return ["ctr", "--address", str(SOCKET), "--namespace", "k8s.io"]


# --- set-up steps ---------------------------------------------------------------------------


def containerd_config() -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{NODE_DIR / "containerd"}"
state = "{RUN_DIR / "containerd-state"}"
[grpc]
  address = "{SOCKET}"
[ttrpc]
  address = "{SOCKET}.ttrpc"
[{cri}]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # This VM's root lacks CAP_SYS_RESOURCE: lowering a sandbox's oom_score_adj would fail.
  restrict_oom_score_adj = true
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [{cri}.containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = "{RUN_DIR / "runc"}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{NODE_DIR / "cni"}"
"""


def cni_config() -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "kube-ddp-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(NODE_DIR / "ipam"),
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config() -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this VM is cgroup v1 (hybrid); 1.36 refuses it by default
        "cgroupDriver": "cgroupfs",  # no systemd here
        "containerRuntimeEndpoint": f"unix://{SOCKET}",
        # The dev apiserver has no kubelet client certificate: the kubelet listens only on the
        # bridge, for `kubectl logs` and `exec`.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": GATEWAY,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "clusterDomain": "cluster.local",
        "clusterDNS": [GATEWAY],
        "resolvConf": "/etc/resolv.conf",
        "failSwapOn": False,
        "readOnlyPort": 0,
        "podLogsDir": str(NODE_DIR / "pod-logs"),
        "serializeImagePulls": False,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "registerWithTaints": [{"key": NODE_TAINT, "value": "true", "effect": "NoSchedule"}],
    }


def corefile(kubeconfig: Path) -> str:
    return f""".:53 {{
    bind {GATEWAY}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} kube-ddp-dev
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
}}
"""


def make_bridge(record: HostRecord) -> None:
    """cni0 before any pod: CoreDNS and the kubelet listen on its address from the start, and
    route_localnet lets DNAT'ed pod traffic reach the apiserver on 127.0.0.1."""
    route_localnet = f"net.ipv4.conf.{BRIDGE}.route_localnet"
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        record.sysctls[route_localnet] = read_sysctl(route_localnet)
    else:
        run("ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge")
        record.bridge = BRIDGE
    run("ip", "addr", "replace", f"{GATEWAY}/16", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    write_sysctl(route_localnet, "1")


def route_to_apiserver(state: State) -> None:
    port = state["ports"]["kube-apiserver"]
    # fmt: off
    run(
        "iptables", "-t", "nat", "-A", "PREROUTING", "-s", POD_CIDR, "-d", f"{API_SERVICE_IP}/32",
        "-p", "tcp", "--dport", "443", "-m", "comment", "--comment", "kube-ddp real node",
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}",
    )
    # fmt: on


def node_ready() -> bool:
    node = api_json_admin(f"/api/v1/nodes/{NODE_NAME}")
    conditions = (node or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def api_json_admin(path: str) -> Any:
    state = running_state()
    return api_json(state["server"], path) if state else None


# --- up and down ----------------------------------------------------------------------------


def read_record() -> NodeRecord | None:
    try:
        record: NodeRecord = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    if "cluster" not in record:  # recorded by a clone's only cluster, under its name
        record["cluster"] = str(Path(record.pop("repo", "")) / ".cluster")
    return record


def is_up() -> bool:
    """This cluster's real node runs."""
    record = read_record()
    return bool(
        record
        and record["cluster"] == THIS_CLUSTER
        and record["components"]
        and all(is_alive(c) for c in record["components"])
    )


def enabled() -> bool:
    """`up` adds the real node unless KUBEDDP_REAL_NODE=0."""
    return os.environ.get("KUBEDDP_REAL_NODE", "1") != "0"


def _other_clusters_node() -> str | None:
    """The cluster (its state directory) whose real node runs here, when it is not this one."""
    record = read_record()
    alive = record and any(is_alive(c) for c in record["components"])
    if record and alive and record["cluster"] != THIS_CLUSTER:
        return record["cluster"]
    return None


def up() -> None:
    """Add the real node to the running control plane (a no-op when it runs). Another
    cluster's node (another clone's, or this one's second cluster's) is waited for: there is
    one per machine."""
    require_root("the real node")
    state = running_state()
    if state is None:
        raise ClusterError("the control plane is not running: `up` starts it first")
    deadline, said = time.monotonic() + OTHER_NODE_WAIT, False
    while True:
        with machine_lock("real-node"):
            other = _other_clusters_node()
            if other is None:
                _up(state)
                return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"the real node of {other} ran on this machine for {OTHER_NODE_WAIT:.0f} s "
                "(one per machine): stop it with `make cluster-down` there"
            )
        if not said:
            log(f"waiting for the real node of {other} to stop (one per machine)")
            said = True
        time.sleep(3)


def _up(state: State) -> None:
    if is_up() and node_ready():
        return
    record = read_record()
    if record:  # whatever a crashed run left, of this cluster or a gone one
        _stop(record)
    packages.ensure([packages.REAL_NODE])
    build_all()
    for name in NODE_BINARIES:
        built(name)
    _start(state)


def _start(state: State) -> None:
    started = time.monotonic()
    host = HostRecord.take()
    for directory in (NODE_DIR, RUN_DIR):
        directory.mkdir(parents=True, exist_ok=True)
    record: NodeRecord = {
        "cluster": THIS_CLUSTER,
        "components": [],
        "host": host.__dict__,
    }

    def save() -> None:
        record["host"] = host.__dict__
        RECORD.write_text(json.dumps(record, indent=2))

    save()
    logs = NODE_DIR / "logs"
    logs.mkdir(exist_ok=True)
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, argv: list[str]) -> None:
        processes[name] = spawn_to(logs / f"{name}.log", argv)
        record["components"].append({"name": name, "pid": processes[name].pid, "argv": argv})
        save()

    try:
        make_bridge(host)
        save()
        (NODE_DIR / "cni").mkdir(exist_ok=True)
        (NODE_DIR / "cni" / "10-kube-ddp.conflist").write_text(json.dumps(cni_config()))
        (NODE_DIR / "containerd.toml").write_text(containerd_config())
        start("containerd", ["containerd", "--config", str(NODE_DIR / "containerd.toml")])
        wait_until("containerd", SOCKET.exists, 30, processes, logs)
        images.import_images(ctr())

        new_certificate(
            PKI,
            "kubelet",
            f"/O=system:masters/CN=system:node:{NODE_NAME}",
            ["extendedKeyUsage=clientAuth"],
        )
        kubeconfig = NODE_DIR / "kubelet.kubeconfig"
        write_kubeconfig(kubeconfig, state["server"], "kubelet")
        (NODE_DIR / "kubelet.json").write_text(json.dumps(kubelet_config(), indent=2))
        (NODE_DIR / "Corefile").write_text(corefile(kubeconfig))
        start(
            "coredns",
            [str(built("coredns")), "-conf", str(NODE_DIR / "Corefile")],
        )
        route_to_apiserver(state)
        start(
            "kubelet",
            [
                str(built("kubelet")),
                f"--config={NODE_DIR / 'kubelet.json'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={NODE_DIR / 'kubelet'}",
                f"--cert-dir={NODE_DIR / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                f"--node-labels={'='.join(NODE_LABEL)}",
                f"--containerd={SOCKET}",  # cAdvisor's view of the containers
            ],
        )
        wait_until(f"node {NODE_NAME} Ready", node_ready, 60, processes, logs)
    except BaseException:
        _stop(record)
        raise
    log(f"real node {NODE_NAME} ready in {time.monotonic() - started:.1f} s")


def down() -> bool:
    """Remove the real node and put the host back; True when there was one."""
    with machine_lock("real-node"):
        return _down_locked()


def _down_locked() -> bool:
    record = read_record()
    if record is None or record["cluster"] != THIS_CLUSTER:
        return False
    _stop(record)
    return True


def _stop(record: NodeRecord) -> None:
    """Pods first (so the kubelet unmounts volumes and releases addresses), then the kubelet,
    any container still there, containerd, CoreDNS; then the host as recorded."""
    drain(record)
    for component in reversed(record["components"]):
        if component["name"] == "containerd":
            kill_containers()
        stop_component(component, grace=10)
    kill_shims()
    host = HostRecord(**record["host"])
    host.restore([NODE_DIR, RUN_DIR])  # RUN_DIR: the sandboxes' /dev/shm mounts
    with contextlib.suppress(ClusterError):
        kubectl("delete", "node", NODE_NAME, "--ignore-not-found", "--wait=false")
    shutil.rmtree(NODE_DIR, ignore_errors=True)
    shutil.rmtree(RUN_DIR, ignore_errors=True)


def drain(record: NodeRecord) -> None:
    """Delete the node's pods and wait (a while) for the kubelet to tear them down."""
    kubelet = next((c for c in record["components"] if c["name"] == "kubelet"), None)
    if kubelet is None or not is_alive(kubelet) or running_state() is None:
        return
    try:
        kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={NODE_NAME}",
            "--grace-period=0",
            "--force",
            "--wait=false",
        )
    except ClusterError as error:
        log(f"could not delete the real node's pods: {error}")
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and running_tasks():
        time.sleep(0.5)


def containers() -> list[str]:
    if not SOCKET.exists():
        return []
    return run(*ctr(), "containers", "list", "-q", check=False).split()


def running_tasks() -> list[str]:
    """Containers with a running process (a stopped sandbox has none: its pod is torn down)."""
    if not SOCKET.exists():
        return []
    rows = [line.split() for line in run(*ctr(), "tasks", "list", check=False).splitlines()[1:]]
    return [row[0] for row in rows if len(row) >= 3 and row[2] == "RUNNING"]


def kill_containers() -> None:
    """What the kubelet did not stop: every task killed, every container removed."""
    for container in containers():
        run(*ctr(), "tasks", "kill", "--signal", "SIGKILL", container, check=False)
        for _ in range(50):  # the task is deleted once its process has died
            try:
                run(*ctr(), "tasks", "delete", container)
                break
            except ClusterError as error:
                if "not found" in str(error):
                    break
            time.sleep(0.1)
        run(*ctr(), "containers", "delete", container, check=False)


def kill_shims() -> None:
    """containerd-shim processes of our containerd outlive it: found by its socket in their
    command line, never by name alone."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            cmdline
            and cmdline[0].endswith(b"containerd-shim-runc-v2")
            and str(SOCKET).encode() in cmdline
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), 9)
