"""The real node leaves the host as it found it: after `down`, no process, mount, iptables
rule, sysctl, /etc/hosts line, cgroup, network namespace or link it made is left."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.support import Cluster, load_dev_cluster, wait_for
from tests.host_tools import require

NODE_PROCESSES = re.compile(rb"(containerd|kubelet|coredns|/pause$)")


def processes() -> set[str]:
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")[0]
            state = (proc / "stat").read_text().split(") ")[-1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and NODE_PROCESSES.search(cmdline):  # zombies wait for their parent
            found.add(cmdline.decode(errors="replace"))
    return found


def iptables_rules() -> set[str]:
    """Every rule and user chain; an empty built-in table left by nf_tables is no rule."""
    lines = set()
    for tool in ("iptables-save", "ip6tables-save"):
        dump = subprocess.run([tool], capture_output=True, text=True, check=True).stdout
        table = ""
        for line in dump.splitlines():
            if line.startswith("*"):
                table = line
            elif line.startswith("-A") or (line.startswith(":") and "ACCEPT" not in line):
                lines.add(f"{tool} {table} {line.split(' [')[0]}")
    return lines


def host_state() -> dict[str, Any]:
    node, host = load_dev_cluster().node, load_dev_cluster().host
    sysctls = {name: Path("/proc/sys", name.replace(".", "/")).read_text() for name in host.SYSCTLS}
    return {
        "processes": processes(),
        "iptables": iptables_rules(),
        "sysctls": sysctls,
        "hosts": Path("/etc/hosts").read_text(),
        "mounts": {
            line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
        },
        "links": set(os.listdir("/sys/class/net")),
        "netns": set(os.listdir("/var/run/netns")) if Path("/var/run/netns").is_dir() else set(),
        "cgroups": {str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")},
        "paths": {p for p in host.SHARED_PATHS if Path(p).exists()}
        | {str(p) for p in (node.NODE_DIR, node.RUN_DIR) if p.exists()},
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="the real node needs root")
def test_down_leaves_the_host_as_it_was(cluster: Cluster, namespace: str) -> None:
    require("REAL_NODE")  # host_state reads iptables with its tools
    dev_cluster = load_dev_cluster()
    dev_cluster.node.down()  # a node of `make cluster-up` or an earlier test: not ours to judge
    before = host_state()
    dev_cluster.node.up()
    try:
        # A pod with a volume, an address and a container: mounts, cgroups, netns, iptables.
        cluster.kubectl(
            "run",
            "probe",
            "-n",
            namespace,
            "--image=localhost/hostusr:local",
            "--image-pull-policy=Never",
            "--restart=Never",
            '--overrides={"spec": {"nodeSelector": {"kubeddp.io/real": "true"}, '
            '"tolerations": [{"key": "kubeddp.io/real-node", "operator": "Exists"}], '
            '"volumes": [{"name": "usr", "hostPath": {"path": "/usr"}}], '
            '"containers": [{"name": "probe", "image": "localhost/hostusr:local", '
            '"imagePullPolicy": "Never", "command": ["/bin/sleep", "600"], '
            '"volumeMounts": [{"name": "usr", "mountPath": "/usr", "readOnly": true}]}]}}',
        )
        wait_for(
            lambda: cluster.core.read_namespaced_pod("probe", namespace).status.phase == "Running",
            "the probe pod to run",
            timeout=60,
        )
        during = host_state()
        assert during["processes"] - before["processes"]  # the node really ran
        # The bridge's own address, not its pod's port's: the pod going would change it.
        bridge = Path("/sys/class/net", dev_cluster.node.BRIDGE, "address").read_text().strip()
        assert bridge == dev_cluster.node.BRIDGE_MAC
        assert during["iptables"] - before["iptables"]
    finally:
        dev_cluster.node.down()
    after = host_state()
    for key, value in before.items():
        assert after[key] == value, key
