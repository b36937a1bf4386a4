"""The kind path users take (`kind create cluster`, `kind load`, `helm install`), run here.

Our machines have no Docker engine and no registry to pull `kindest/node` from, so:
- podman is kind's provider (`KIND_EXPERIMENTAL_PROVIDER=podman`), with runc (crun refuses this
  VM's hybrid cgroups), open-file limits within the VM's hard limit, and the same image store
  as the buildah that builds our images (`environment`);
- the node image is assembled from what the dev cluster builds (`node_image`): a Debian
  bookworm root file system with systemd, containerd, runc and the CNI plugins from Debian
  (the real node's), kind's own files from its module (entrypoint, units, sysctls), kubeadm,
  kubelet and kubectl from the Kubernetes module, and the control plane's images made from
  our builds and imported, not unpacked, into its containerd as kind's own build does.

Where it differs from a `kindest/node`: one node only (a static bridge CNI config stands in for
kindnetd; /kind/manifests/default-cni.yaml only records it), etcd and CoreDNS are the versions
the dev cluster builds, tagged with the names kubeadm asks for, and containerd is Debian's
1.6 with `restrict_oom_score_adj` (this VM's root lacks CAP_SYS_RESOURCE).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from devcluster import host, images
from devcluster.build import (
    COREDNS_VERSION,
    ETCD_VERSION,
    KIND_MODULE,
    KIND_VERSION,
    KUBERNETES_VERSION,
    built,
    module_dir,
)
from devcluster.paths import CACHE_DIR, ClusterError, log
from devcluster.processes import run

NODE_IMAGE = f"localhost/kube-ddp-kind-node:{KUBERNETES_VERSION}"
# This VM has cgroup v1, which systemd gives up from 256 on (trixie's is 257): bookworm's 252.
NODE_SUITE = "bookworm"
NODE_PACKAGES = (
    "systemd", "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux",
    "mount", "kmod", "libseccomp2", "pigz", "ca-certificates", "curl", "jq", "procps", "bash",
    "containerd", "runc", "containernetworking-plugins",
)  # fmt: skip
# kube-proxy runs iptables and conntrack: its image is a small Debian with them.
PROXY_PACKAGES = ("iptables", "conntrack", "nftables", "ipset")
# What kubeadm v1.36 pulls (`kubeadm config images list`): the etcd and CoreDNS images are our
# builds (build.ETCD_VERSION, build.COREDNS_VERSION) under the names kubeadm asks for.
REGISTRY = "registry.k8s.io"
ETCD_IMAGE = f"{REGISTRY}/etcd:3.6.8-0"
COREDNS_IMAGE = f"{REGISTRY}/coredns/coredns:v1.14.2"
PAUSE_IMAGE = f"{REGISTRY}/pause:3.10.2"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The pod CIDR of the one node: the first /24 of kind's default pod subnet, 10.244.0.0/16.
NODE_POD_CIDR = "10.244.0.0/24"
KIND_DIR = CACHE_DIR / "kind"
KIND_NETWORK = "kind"  # the podman network kind creates and never removes
# kind mounts it into every node; this VM has none (its kernel has everything built in).
MODULES = Path("/lib/modules")
# For hosts on cgroup v1, like this VM: kubelet 1.36 refuses it unless told (kind does not).
CGROUP_V1_CONFIG = """\
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false
"""

CONTAINERD_CONFIG = f"""\
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  tolerate_missing_hugepages_controller = true
  # This VM's root lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj.
  restrict_oom_score_adj = true
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
[plugins."io.containerd.grpc.v1.cri".containerd]
  discard_unpacked_layers = true
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""

CNI_CONFIG = {
    "cniVersion": "0.4.0",
    "name": "kind",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": True,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": NODE_POD_CIDR}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}

DEFAULT_CNI_MANIFEST = f"""\
# kind applies this file as its CNI: this node image has no kindnetd; its one node's pods use
# the bridge configuration below, written into the image (/etc/cni/net.d/10-kind.conflist).
apiVersion: v1
kind: ConfigMap
metadata:
  name: kind-node-cni
  namespace: kube-system
data:
  10-kind.conflist: '{json.dumps(CNI_CONFIG)}'
"""

DEFAULT_STORAGE_MANIFEST = """\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
"""

# --- podman as kind's provider --------------------------------------------------------------


def environment() -> dict[str, str]:
    """The environment kind and podman need here (written files under the cache): podman with
    runc, ulimits within the VM's hard limit, buildah's store; kind on PATH."""
    KIND_DIR.mkdir(parents=True, exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    containers_conf = KIND_DIR / "containers.conf"
    containers_conf.write_text(
        '[engine]\nruntime = "runc"\n[containers]\n'
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=4096:4096"]\n'
    )
    store = CACHE_DIR / "containers"
    storage_conf = KIND_DIR / "storage.conf"
    storage_conf.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{store / "root"}"\n'
        f'runroot = "{store / "run"}"\n'
    )
    env = dict(os.environ)
    env.update(
        KIND_EXPERIMENTAL_PROVIDER="podman",
        CONTAINERS_CONF=str(containers_conf),
        CONTAINERS_STORAGE_CONF=str(storage_conf),
        PATH=f"{built('kind').parent}:{env.get('PATH', '')}",
    )
    return env


def cgroup_v1_config() -> Path:
    """A kind cluster configuration for this VM's cgroup v1 (`--config`)."""
    KIND_DIR.mkdir(parents=True, exist_ok=True)
    path = KIND_DIR / "cgroup-v1.yaml"
    path.write_text(CGROUP_V1_CONFIG)
    return path


@contextlib.contextmanager
def host_prepared() -> Iterator[dict[str, str]]:
    """kind's environment, with the host as kind needs it and put back afterwards: an empty
    /lib/modules while there is none, and the network podman makes for kind removed, with the
    sysctls and iptables rules it changed."""
    record = host.HostRecord.take()
    links = _links()
    made_modules = not MODULES.exists()
    if made_modules:
        MODULES.mkdir()
    env = environment()
    try:
        yield env
    finally:
        run("podman", "network", "rm", "--force", KIND_NETWORK, check=False, env=env)
        for link in _links() - links:  # podman's bridges and their veths
            run("ip", "link", "delete", link, check=False)
        if made_modules:
            MODULES.rmdir()
        record.restore([])


def _links() -> set[str]:
    return {path.name for path in Path("/sys/class/net").iterdir()}


# --- the node image ---------------------------------------------------------------------------


def _mmdebstrap(packages: tuple[str, ...], out: Path, *hooks: str) -> None:
    run(
        "mmdebstrap", "--variant=minbase", f"--include={','.join(packages)}",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        *(f"--customize-hook={hook}" for hook in hooks),
        NODE_SUITE, str(out),
        what=f"mmdebstrap ({out.name})",
    )  # fmt: skip


# As kind's base image Dockerfile prepares systemd for a container.
SYSTEMD_HOOKS = (
    'rm -f "$1"/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service',
    'rm -f "$1"/lib/systemd/system/multi-user.target.wants/* "$1"/etc/systemd/system/*.wants/*',
    'rm -f "$1"/lib/systemd/system/local-fs.target.wants/*',
    'rm -f "$1"/lib/systemd/system/sockets.target.wants/*udev*',
    'rm -f "$1"/lib/systemd/system/sockets.target.wants/*initctl*',
    'rm -f "$1"/lib/systemd/system/basic.target.wants/*',
    'echo ReadKMsg=no >> "$1"/etc/systemd/journald.conf',
    'ln -sf /usr/lib/systemd/systemd "$1"/sbin/init',
    'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb',
)


def _files_image(
    name: str, files: dict[str, Path], out: Path, entrypoint: list[str] | None = None
) -> None:
    """A one-layer image of static binaries (`files`: path in the image -> file here); pods
    name the command of each but CoreDNS's, which gives only arguments."""

    def add(tar: tarfile.TarFile) -> None:
        for target, source in files.items():
            images._entry(tar, target.lstrip("/"), data=source.read_bytes(), mode=0o755)

    runtime: dict[str, object] | None = {"Entrypoint": entrypoint} if entrypoint else None
    images.write_oci_archive(name, add, [], out, runtime)


def _proxy_image(work: Path, out: Path) -> None:
    """kube-proxy on a small Debian with iptables, as an OCI archive."""
    rootfs = work / "proxy-rootfs.tar"
    _mmdebstrap(PROXY_PACKAGES, rootfs, SYSTEMD_HOOKS[-1])
    buildah = images._buildah()
    name = f"{REGISTRY}/kube-proxy:{KUBERNETES_VERSION}"
    container = run(*buildah, "from", "scratch").strip()
    try:
        run(*buildah, "add", container, str(rootfs), "/")
        run(*buildah, "copy", "--chmod", "0755", container, str(built("kube-proxy")),
            "/usr/local/bin/kube-proxy")  # fmt: skip
        run(*buildah, "config", "--env", f"PATH={images.PATH}", container)
        run(*buildah, "commit", "--quiet", container, name)
    finally:
        run(*buildah, "rm", container, check=False)
    run(*buildah, "push", "--quiet", name, f"oci-archive:{out}:{name}")
    run(*buildah, "rmi", name)  # it lives in the node image only


def _component_archives(work: Path) -> list[Path]:
    """The images kubeadm and containerd ask for, as OCI archives in `work`."""
    archives = []

    def archive(stem: str) -> Path:
        path = work / f"{stem}.tar"
        archives.append(path)
        return path

    for component in CONTROL_PLANE:
        _files_image(
            f"{REGISTRY}/{component}:{KUBERNETES_VERSION}",
            {f"/usr/local/bin/{component}": built(component)},
            archive(component),
        )
    _files_image(ETCD_IMAGE, {"/usr/local/bin/etcd": built("etcd")}, archive("etcd"))
    _files_image(COREDNS_IMAGE, {"/coredns": built("coredns")}, archive("coredns"), ["/coredns"])
    _files_image(PAUSE_IMAGE, {"/pause": images.build_pause(work)}, archive("pause"), ["/pause"])
    _proxy_image(work, archive("kube-proxy"))
    return archives


def _containerd_root(archives: list[Path], work: Path) -> Path:
    """A containerd root holding `archives` imported (content only) in the k8s.io namespace,
    by a containerd of its own: the node's containerd starts with them."""
    root, state = work / "containerd-root", work / "containerd-state"
    address = state / "containerd.sock"
    config = work / "containerd-import.toml"
    config.write_text(
        'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'root = "{root}"\nstate = "{state}"\n[grpc]\n  address = "{address}"\n'
        f'[ttrpc]\n  address = "{state / "containerd.sock.ttrpc"}"\n'
    )
    daemon = subprocess.Popen(
        ["containerd", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        ctr = ["ctr", "--address", str(address), "--namespace", "k8s.io"]
        deadline = time.monotonic() + 30
        while subprocess.run([*ctr, "version"], capture_output=True, check=False).returncode != 0:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise ClusterError("a containerd to import the kind node's images did not start")
            time.sleep(0.2)
        for path in archives:
            run(*ctr, "images", "import", "--label=io.cri-containerd.pinned=pinned",
                "--all-platforms", "--no-unpack", "--digests", str(path),
                what=f"importing {path.name} for the kind node")  # fmt: skip
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    return root


def _kind_files() -> Path:
    """kind's node files (images/base/files) from its module, as `kind build` uses them."""
    return module_dir(KIND_MODULE, KIND_VERSION) / "images" / "base" / "files"


def _node_tree(work: Path, containerd_root: Path) -> Path:
    """Everything the node image adds to its Debian root file system, as a directory."""
    tree = work / "node-tree"
    shutil.copytree(_kind_files(), tree, ignore=shutil.ignore_patterns("containerd-fuse-*"))
    (tree / "etc/containerd/config.toml").write_text(CONTAINERD_CONFIG)
    for directory in ("usr/bin", "usr/local/bin", "etc/cni/net.d", "kind/manifests", "var/lib"):
        (tree / directory).mkdir(parents=True, exist_ok=True)
    for binary in ("kubeadm", "kubelet", "kubectl"):
        shutil.copy(built(binary), tree / "usr/bin" / binary)
    # kind's containerd unit runs /usr/local/bin/containerd; Debian's is in /usr/bin.
    (tree / "usr/local/bin/containerd").symlink_to("/usr/bin/containerd")
    (tree / "etc/cni/net.d/10-kind.conflist").write_text(json.dumps(CNI_CONFIG, indent=2))
    (tree / "kind/manifests/default-cni.yaml").write_text(DEFAULT_CNI_MANIFEST)
    (tree / "kind/manifests/default-storage.yaml").write_text(DEFAULT_STORAGE_MANIFEST)
    (tree / "kind/version").write_text(KUBERNETES_VERSION + "\n")
    (tree / "etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copytree(containerd_root, tree / "var/lib/containerd", symlinks=True)
    for script in ("usr/local/bin", "kind/bin"):
        for path in (tree / script).iterdir():
            if not path.is_symlink():
                path.chmod(0o755)
    return tree


RECIPE_LABEL = "io.kube-ddp.recipe"


def _recipe() -> str:
    """What the node image is made of: this module, pause.c and the pinned versions. A
    different recipe means a new image."""
    digest = hashlib.sha256()
    for path in (Path(__file__), images.HERE / "pause.c"):
        digest.update(path.read_bytes())
    digest.update(f"{KIND_VERSION} {KUBERNETES_VERSION} {ETCD_VERSION} {COREDNS_VERSION}".encode())
    return digest.hexdigest()[:16]


def _built_recipe() -> str | None:
    """The recipe label of the node image in the store, None without one."""
    inspect = [*images._buildah(), "inspect", "--type", "image", "--format"]
    label = '{{index .OCIv1.Config.Labels "' + RECIPE_LABEL + '"}}'
    done = subprocess.run(
        [*inspect, label, NODE_IMAGE], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def node_image(rebuild: bool = False) -> str:
    """The kind node image, assembled into the buildah store podman shares (minutes) unless
    one of the same recipe is there."""
    if _built_recipe() == _recipe() and not rebuild:
        return NODE_IMAGE
    start = time.monotonic()
    log(f"assembling the kind node image {NODE_IMAGE} (minutes)")
    with tempfile.TemporaryDirectory(prefix="kube-ddp-kind-", dir=CACHE_DIR) as scratch:
        work = Path(scratch)
        rootfs = work / "node-rootfs.tar"
        _mmdebstrap(NODE_PACKAGES, rootfs, *SYSTEMD_HOOKS)
        tree = _node_tree(work, _containerd_root(_component_archives(work), work))
        buildah = images._buildah()
        container = run(*buildah, "from", "scratch").strip()
        try:
            run(*buildah, "add", container, str(rootfs), "/")
            run(*buildah, "copy", container, str(tree), "/")
            for unit in ("kubelet.service", "containerd.service", "undo-mount-hacks.service"):
                run(*buildah, "run", "--runtime", "/usr/sbin/runc", container,
                    "systemctl", "enable", unit)  # fmt: skip
            run(*buildah, "run", "--runtime", "/usr/sbin/runc", container,
                "systemctl", "mask", "systemd-binfmt.service")  # fmt: skip
            run(
                *buildah, "config",
                "--env", "container=docker",
                "--env", f"PATH={images.PATH}",
                "--stop-signal", "SIGRTMIN+3",
                "--entrypoint", '["/usr/local/bin/entrypoint", "/sbin/init"]',
                "--cmd", "",
                "--label", f"{RECIPE_LABEL}={_recipe()}",
                container,
            )  # fmt: skip
            old = run(*buildah, "images", "--quiet", NODE_IMAGE, check=False).strip()
            run(*buildah, "commit", "--quiet", container, NODE_IMAGE)
            if old:
                run(*buildah, "rmi", old, check=False)
        finally:
            run(*buildah, "rm", container, check=False)
    log(f"assembled {NODE_IMAGE} in {time.monotonic() - start:.0f} s")
    return NODE_IMAGE
