"""Every host command the dev cluster and the test tiers run that a new machine lacks, with the
Debian package that brings it, in one table; and the commands a new machine of this project's
kind has from the start, which are used but never installed.

The test session installs what its tiers need before the first test runs (tests/conftest.py,
as root); `hack/dev-cluster.py packages` installs all of it by hand. A test that needs a tool
asks `require`, which fails naming the package instead of a FileNotFoundError later. And every
command a test session starts is checked against these tables when it ends, so a tool used
without being listed is caught on any machine, also on one where it happens to be installed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devcluster.paths import ClusterError, log
from devcluster.processes import run


@dataclass(frozen=True)
class Need:
    """What one part of the project runs on the host: command (or absolute path) -> package."""

    why: str
    tools: dict[str, str]


# buildah, with runc, builds images from the Dockerfiles on a base mmdebstrap makes
# (devcluster.images): the real node's and `make release-check`'s.
IMAGE_BUILDS = Need(
    "building images", {"buildah": "buildah", "mmdebstrap": "mmdebstrap", "runc": "runc"}
)
# containerd, runc and the CNI plugins for the node; iptables for its DNAT rule and the host
# record (devcluster.host); its images are built here.
REAL_NODE = Need(
    "the real node",
    {
        **IMAGE_BUILDS.tools,
        "containerd": "containerd",
        "ctr": "containerd",
        "/usr/lib/cni/bridge": "containernetworking-plugins",
        "/usr/lib/cni/host-local": "containernetworking-plugins",
        "iptables": "iptables",
        "ip6tables": "iptables",
        "iptables-save": "iptables",
        "ip6tables-save": "iptables",
        "iptables-restore": "iptables",
        "ip6tables-restore": "iptables",
    },
)
# The trainer tier runs the launcher commands kube-ddp renders under real mpirun and Slurm.
LAUNCHERS = Need(
    "mpirun and Slurm for the trainer tier",
    {
        "mpirun": "openmpi-bin",
        # a Gaudi node's topology (2 sockets x 24 cores) for mpirun to map by
        "lstopo-no-graphics": "hwloc-nox",
        "slurmctld": "slurm-wlm",
        "slurmd": "slurm-wlm",
        "srun": "slurm-client",
        "sbatch": "slurm-client",
        "sinfo": "slurm-client",
    },
)
# The real node's pods run the host's /usr (tests/e2e/platform.py): mpirun, ssh and sshd too.
MPI_PODS = Need(
    "MPI between pods",
    {"mpirun": "openmpi-bin", "ssh": "openssh-client", "sshd": "openssh-server"},
)
# kube-router's firewall keeps the sets of pod addresses its iptables rules match in ipsets.
NETWORK_POLICY = Need("NetworkPolicy on the real node", {"ipset": "ipset"})
# The kind path (devcluster.kind, tests/kind): podman as kind's provider, and the node image
# assembled with mmdebstrap and buildah, its images imported by a containerd of its own.
KIND = Need(
    "the kind path",
    {
        **IMAGE_BUILDS.tools,
        "podman": "podman",
        "containerd": "containerd",
        "ctr": "containerd",
        "sysctl": "procps",
    },
)
NEEDS = (REAL_NODE, LAUNCHERS, MPI_PODS, NETWORK_POLICY, KIND)
INSTALLED = {tool: package for need in NEEDS for tool, package in need.tools.items()}

# On every new machine of this project's kind (Debian 12 with Go, Python and gcc: coreutils,
# util-linux, mount, iproute2, procps, openssl, openssh-client): used, never installed.
BASE = frozenset(
    {
        "apt-get",
        "awk",  # mawk, required by Debian; also run in a kind node (tests/e2e/platform.py)
        "bash",
        "cat",
        "chown",
        "dpkg-deb",  # takes a binary out of a Debian package (devcluster.build.FROM_DEBIAN)
        "env",
        "gcc",
        "getent",  # the MPI launcher's script waits on it (libc-bin)
        "git",
        "go",
        "ip",
        "kill",
        "ldconfig",  # ctypes.util.find_library runs it (libc-bin)
        "make",
        "mkdir",
        "mount",
        "openssl",
        "python3",
        "rm",
        "setpriv",
        "sh",
        "sleep",
        "true",
        "umount",
        "unshare",
    }
)
REMEDY = "`hack/dev-cluster.py packages` (as root) installs every package the test tiers use"


def _present(tool: str) -> bool:
    return Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None


def missing(tools: Iterable[str]) -> list[str]:
    return [tool for tool in tools if not _present(tool)]


def _packages(tools: Iterable[str], needs: Iterable[Need]) -> list[str]:
    table = {tool: package for need in needs for tool, package in need.tools.items()}
    return sorted({table[tool] for tool in tools})


def install(packages: Iterable[str], why: str) -> None:
    """apt-get install `packages` (no recommends), or a ClusterError saying what to run."""
    wanted = list(packages)
    if os.geteuid() != 0:
        raise ClusterError(
            f"{why} needs the Debian packages {' '.join(wanted)}: run as root, or "
            f"`apt-get install --no-install-recommends {' '.join(wanted)}` first"
        )
    log(f"installing {', '.join(wanted)} from Debian ({why})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    wait = ("-o", "DPkg::Lock::Timeout=600")  # another clone's session may be installing
    run("apt-get", *wait, "update", "-qq", env=env)
    run("apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends", *wanted, env=env)


def ensure(needs: Iterable[Need]) -> list[str]:
    """Install, in one apt-get, the packages of every missing tool of `needs`; the packages
    installed (none when nothing was missing)."""
    needs = list(needs)
    absent = missing({tool for need in needs for tool in need.tools})
    if not absent:
        return []
    wanted = _packages(absent, needs)
    install(wanted, " and ".join(need.why for need in needs if set(need.tools) & set(absent)))
    still = missing(absent)
    if still:
        raise ClusterError(f"installed {' '.join(wanted)}, yet {', '.join(still)} is still missing")
    return wanted


def require(need: Need) -> None:
    """A ClusterError naming each missing tool's package and how to install it."""
    absent = missing(need.tools)
    if absent:
        raise ClusterError(
            f"{need.why} needs {', '.join(absent)}, missing here (Debian's "
            f"{' '.join(_packages(absent, [need]))}): {REMEDY}"
        )


def unlisted(commands: Iterable[str]) -> list[str]:
    """The host commands among `commands` (names or paths) that neither table lists."""
    known = INSTALLED.keys() | BASE
    return sorted({c for c in commands if c not in known and Path(c).name not in known})
