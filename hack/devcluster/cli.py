"""`hack/dev-cluster.py build|up|down|status|mpi-operator|kueue|kind-image|kind-env|packages|tool`:
the command line."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import devcluster
from devcluster import controlplane, kind, kueue, mpioperator, node, packages
from devcluster.build import ADDONS, BUILDS, build_all, built
from devcluster.paths import KUBECONFIG, STATE_DIR, BuildError, ClusterError, log
from devcluster.processes import is_alive

# What `up` runs and puts on PATH beyond the control plane.
UP_TOOLS = ("helm", *node.NODE_BINARIES)


def cmd_build(_: argparse.Namespace) -> int:
    build_all()
    for name in UP_TOOLS:
        built(name)
    for build in (*BUILDS, *(b for b in ADDONS if b.packages.keys() & set(UP_TOOLS))):
        print(f"{build.name} {build.version}: {build.bin_dir}")
    return 0


def cmd_tool(args: argparse.Namespace) -> int:
    """Run one of the pinned tools (helm, kubectl, actionlint...), built first if need be."""
    tool = built(args.tool)
    return subprocess.run([str(tool), *args.args], check=False).returncode


def cmd_packages(_: argparse.Namespace) -> int:
    """Install the Debian packages of every host tool the test tiers use (as root)."""
    installed = packages.ensure(packages.NEEDS)
    print(f"installed {' '.join(installed)}" if installed else "every host tool is installed")
    return 0


def cmd_up(_: argparse.Namespace) -> int:
    built("helm")  # on the PATH it prints
    state = controlplane.up()
    if node.enabled():
        node.up()
    print(f"cluster running at {state['server']}")
    if node.is_up():
        print(f"  real node {node.NODE_NAME}: pods need nodeSelector {'='.join(node.NODE_LABEL)}")
        print(f"  and a toleration of {node.NODE_TAINT}; logs in {node.NODE_DIR / 'logs'}")
    print(f"  export KUBECONFIG={KUBECONFIG}")
    print(f"  export PATH={STATE_DIR / 'bin'}:$PATH")
    return 0


def cmd_mpi_operator(_: argparse.Namespace) -> int:
    """Run the MPI Operator against the running cluster until ^C (launcher: mpi jobs need it)."""
    if not controlplane.running_state():
        raise ClusterError("the cluster is not running: `hack/dev-cluster.py up` first")
    # SIGTERM too (and SIGINT where a shell started it in the background, ignoring SIGINT).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with mpioperator.running():
        print(f"MPI Operator running; its log: {mpioperator.LOG}; ^C stops it")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


def cmd_kueue(_: argparse.Namespace) -> int:
    """Run Kueue against the running cluster until ^C, then take it all away again."""
    state = controlplane.running_state()
    if not state:
        raise ClusterError("the cluster is not running: `hack/dev-cluster.py up` first")
    # ^C or SIGTERM (also when started in the background, where SIGINT comes ignored).
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.default_int_handler)
    with kueue.running(state):
        print(f"Kueue running; its log: {kueue.LOG}; ^C stops and removes it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


def cmd_kind_image(args: argparse.Namespace) -> int:
    """Assemble the kind node image from our builds (kept in the store once made)."""
    packages.ensure([packages.KIND])
    print(kind.node_image(rebuild=args.rebuild))
    return 0


def cmd_kind_env(_: argparse.Namespace) -> int:
    """The shell lines that point kind at podman and at the node image, for a reader's shell."""
    env = kind.environment()
    for name in ("KIND_EXPERIMENTAL_PROVIDER", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"):
        print(f"export {name}={env[name]}")
    print(f"export PATH={built('kind').parent}:$PATH")
    print(f"# kind create cluster --image {kind.NODE_IMAGE} --config {kind.cgroup_v1_config()}")
    if not kind.MODULES.exists():
        print(f"# kind mounts {kind.MODULES} into its nodes: `mkdir {kind.MODULES}` first")
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    print("cluster stopped" if devcluster.down() else "cluster was not running")
    return 0


def resident_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    state = controlplane.read_state()
    if not state:
        print("cluster is not running")
        return 1
    print(f"server {state['server']}  kubeconfig {state['kubeconfig']}  owner {state['owner']}")
    record = node.read_record()
    node_components = (
        record["components"] if record and record["cluster"] == node.THIS_CLUSTER else []
    )
    all_alive, total_mib = True, 0
    for prefix, component in [
        *(("", c) for c in state["components"]),
        *(("node ", c) for c in node_components),
    ]:
        alive = is_alive(component)
        all_alive &= alive
        mib = resident_mib(component["pid"]) if alive else 0
        total_mib += mib
        word = f"running, {mib} MiB resident" if alive else "DEAD"
        print(f"  {prefix + component['name']:<24} pid {component['pid']:<8} {word}")
    print(f"  {'total':<37} {total_mib} MiB resident")
    if not all_alive:
        print("some components are dead: `up` cleans up and starts afresh")
    return 0 if all_alive else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="dev-cluster.py", description="A real Kubernetes cluster on 127.0.0.1 for kube-ddp."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, func, help_text in (
        ("build", cmd_build, "build the pinned binaries into the cache (no-op when warm)"),
        ("up", cmd_up, "start the cluster (no-op when it runs)"),
        ("down", cmd_down, "stop the processes `up` started"),
        ("status", cmd_status, "say what runs"),
        ("mpi-operator", cmd_mpi_operator, "run the Kubeflow MPI Operator here until ^C"),
        ("kueue", cmd_kueue, "run Kueue (its CRDs and webhooks) here until ^C"),
        ("packages", cmd_packages, "install the Debian packages the test tiers use (root)"),
    ):
        commands.add_parser(name, help=help_text).set_defaults(func=func)
    kind_image = commands.add_parser("kind-image", help="assemble the kind node image (podman)")
    kind_image.add_argument("--rebuild", action="store_true", help="even if it exists")
    kind_image.set_defaults(func=cmd_kind_image)
    commands.add_parser(
        "kind-env", help="print the exports that run kind with podman here"
    ).set_defaults(func=cmd_kind_env)
    tool = commands.add_parser("tool", help="run a pinned tool: tool NAME [ARGS...]")
    tool.add_argument("tool", help="actionlint, helm, kubectl, ...")
    tool.add_argument("args", nargs=argparse.REMAINDER)
    tool.set_defaults(func=cmd_tool)
    args = parser.parse_args()
    try:
        return int(args.func(args))
    except (BuildError, ClusterError) as error:
        log(str(error))
        return 1
