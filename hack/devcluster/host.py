"""What the real node changes on the host, recorded before and put back after.

`HostRecord.take()` notes the sysctls the kubelet and the CNI bridge set, the iptables rules
(IPv4 and IPv6) and the network namespaces as they are; `restore()` unmounts what is mounted
under the node's directory, removes the cgroups, network namespaces and the bridge it made, and
puts iptables and the sysctls back as recorded. The record is a file, so a later `down` (or the
next `up`) can still restore after a crash.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devcluster.paths import ClusterError
from devcluster.processes import run

# Set by the kubelet ("Updating kernel flag"), the CNI bridge (ip_forward) and us (route_localnet).
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "net.ipv4.ip_forward",
)
IPTABLES = ("iptables", "ip6tables")
# Places containerd and the kubelet write to whatever they are told: removed if they were new,
# else their new entries are.
SHARED_PATHS = ("/run/containerd", "/var/log/containers", "/var/log/pods", "/var/lib/kubelet")
NETNS_DIR = Path("/var/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"  # the kubelet's cgroup of pods (cgroupfs driver), in every hierarchy


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str:
    return _sysctl_path(name).read_text().strip()


def write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value)


def _tables(dump: str) -> dict[str, str]:
    """iptables-save output split by table: {name: its section, '*name' to 'COMMIT'}."""
    tables: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in dump.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:], [line])
        elif current is not None and not line.startswith("#"):
            current.append(line)
            if line == "COMMIT":
                current = None
    return {name: "\n".join(lines) + "\n" for name, lines in tables.items()}


@dataclass
class HostRecord:
    sysctls: dict[str, str] = field(default_factory=dict)
    iptables: dict[str, dict[str, str]] = field(default_factory=dict)  # tool -> table -> dump
    netns: list[str] = field(default_factory=list)
    shared: dict[str, list[str] | None] = field(default_factory=dict)  # None: did not exist
    bridge: str | None = None  # the bridge we created, removed on restore

    @classmethod
    def take(cls) -> HostRecord:
        return cls(
            sysctls={name: read_sysctl(name) for name in SYSCTLS},
            iptables={tool: _tables(run(f"{tool}-save")) for tool in IPTABLES},
            netns=sorted(p.name for p in NETNS_DIR.glob("*")) if NETNS_DIR.is_dir() else [],
            shared={path: _listing(Path(path)) for path in SHARED_PATHS},
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> HostRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def restore(self, node_dirs: list[Path]) -> None:
        """Put the host back (what is mounted below `node_dirs` unmounted first); each step runs
        even when one before it failed."""
        problems = []
        steps: list[Callable[[], None]] = [
            *(functools.partial(unmount_below, directory) for directory in node_dirs),
            self._remove_netns,
            remove_cgroups,
            self._remove_bridge,
            self._remove_shared,
            self._restore_iptables,
            self._restore_sysctls,
        ]
        for step in steps:
            try:
                step()
            except (OSError, ClusterError) as error:
                problems.append(str(error))
        if problems:
            raise ClusterError("the host could not be restored fully: " + "; ".join(problems))

    def _remove_netns(self) -> None:
        if not NETNS_DIR.is_dir():
            return
        for path in NETNS_DIR.iterdir():
            if path.name not in self.netns:
                run("umount", str(path), check=False)
                path.unlink(missing_ok=True)

    def _remove_bridge(self) -> None:
        if self.bridge and Path(f"/sys/class/net/{self.bridge}").exists():
            run("ip", "link", "delete", self.bridge)

    def _remove_shared(self) -> None:
        for name, before in self.shared.items():
            path = Path(name)
            if not path.exists():
                continue
            if before is None:
                run("rm", "-rf", "--one-file-system", name)
            else:
                for entry in path.iterdir():
                    if entry.name not in before:
                        run("rm", "-rf", "--one-file-system", str(entry))

    def _restore_iptables(self) -> None:
        for tool, before in self.iptables.items():
            now = _tables(run(f"{tool}-save"))
            for table in now:
                if table in before:
                    run(f"{tool}-restore", "--table", table, stdin=before[table])
                else:  # made since: empty it (nf_tables keeps an empty table; that is harmless)
                    run(tool, "-t", table, "-F")
                    run(tool, "-t", table, "-X")

    def _restore_sysctls(self) -> None:
        for name, value in self.sysctls.items():
            if read_sysctl(name) != value:
                write_sysctl(name, value)


def _listing(path: Path) -> list[str] | None:
    return sorted(entry.name for entry in path.iterdir()) if path.is_dir() else None


def mounts_below(directory: Path) -> list[str]:
    """Mount points at or below `directory`, deepest first."""
    prefix = str(directory.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=lambda p: p.count("/"), reverse=True)


def unmount_below(directory: Path) -> None:
    for _ in range(3):  # a bind mount of a directory onto itself shows twice
        points = mounts_below(directory)
        if not points:
            return
        for point in points:
            run("umount", point, check=False)
    left = mounts_below(directory)
    for point in left:
        run("umount", "--lazy", point, check=False)
    if mounts_below(directory):
        raise ClusterError(f"still mounted: {', '.join(mounts_below(directory))}")


def remove_cgroups() -> None:
    """The kubelet's `kubepods` cgroups in every hierarchy, deepest first, once empty."""
    left = []
    for hierarchy in CGROUP_ROOT.iterdir():
        root = hierarchy / KUBEPODS
        if not root.is_dir():
            continue
        directories = sorted(
            (p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        )
        for directory in [*directories, root]:
            for _ in range(20):  # the last processes may still be leaving
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            if directory.exists():
                left.append(str(directory))
    if left:
        raise ClusterError(f"cgroups still in use: {', '.join(left[:5])}")


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ClusterError(
            f"{what} needs root (it installs packages, starts containerd and the kubelet, and "
            "adds an iptables rule); run it as root, or skip the real node with "
            "KUBEDDP_REAL_NODE=0"
        )
