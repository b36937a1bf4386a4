#!/usr/bin/env python3
"""A real Kubernetes control plane on 127.0.0.1, built from published Go modules.

    dev-cluster.py build    build the pinned binaries into the cache (no-op when warm)
    dev-cluster.py up       build if needed, start etcd, kube-apiserver, kube-controller-manager,
                            kube-scheduler and kwok, create the fake nodes, wait until ready
    dev-cluster.py down     stop exactly the processes `up` started
    dev-cluster.py status   say what runs

Binaries are cached under $KUBEDDP_CACHE_DIR (default ~/.cache/kube-ddp), keyed by version; the
cluster's state (kubeconfig, certificates, etcd data, logs, pids) lives in .cluster/ of the repo.
Standard library only, plus the `go` toolchain for a cold build and `openssl` for certificates.
See hack/README.md and docs/dev-cluster.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"
STATE_DIR = REPO / ".cluster"
CACHE_DIR = Path(os.environ.get("KUBEDDP_CACHE_DIR") or Path.home() / ".cache" / "kube-ddp")


@dataclasses.dataclass(frozen=True)
class GoBuild:
    """One wrapper module that builds some main packages of one upstream module version."""

    name: str
    module: str
    version: str
    packages: dict[str, str]  # binary name -> main package
    ldflags: tuple[str, ...] = ()
    staging_replaces: bool = False  # k8s.io/kubernetes needs its staging modules pinned
    module_files: tuple[str, ...] = ()  # copied from the module next to the binaries

    @property
    def bin_dir(self) -> Path:
        return CACHE_DIR / "bin" / f"{self.name}-{self.version}"

    @property
    def work_dir(self) -> Path:
        return CACHE_DIR / "build" / f"{self.name}-{self.version}"

    @property
    def recipe(self) -> str:
        """Written next to the binaries: a changed recipe (flags, say) means a rebuild."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def is_built(self) -> bool:
        wanted = [*self.packages, *(Path(f).name for f in self.module_files)]
        try:
            same_recipe = (self.bin_dir / "recipe.json").read_text() == self.recipe
        except OSError:
            return False
        return same_recipe and all((self.bin_dir / name).is_file() for name in wanted)


def _kubernetes_ldflags(version: str) -> tuple[str, ...]:
    # Module zips carry the placeholder version "v0.0.0-master+$Format:%H$"; stamp the real one
    # so /version, `kubectl version` and Helm's .Capabilities.KubeVersion are right.
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.gitCommit=",  # the module zip does not say which commit it is
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


BUILDS = (
    GoBuild(
        name="kubernetes",
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        packages={
            binary: f"k8s.io/kubernetes/cmd/{binary}"
            for binary in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
        },
        ldflags=_kubernetes_ldflags(KUBERNETES_VERSION),
        staging_replaces=True,
    ),
    GoBuild(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD_VERSION,
        packages={"etcd": "go.etcd.io/etcd/server/v3"},
    ),
    GoBuild(
        name="kwok",
        module="sigs.k8s.io/kwok",
        version=KWOK_VERSION,
        packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION.lstrip('v')}",),
        # The standalone kwok has no built-in stages; keep upstream's defaults with the binary.
        module_files=tuple(
            f"kustomize/stage/{stage}.yaml"
            for stage in (
                "node/fast/node-initialize",
                "node/heartbeat-with-lease/node-heartbeat-with-lease",
                "pod/fast/pod-ready",
                "pod/fast/pod-delete",
            )
        ),
    ),
    GoBuild(
        name="helm",
        module="helm.sh/helm/v3",
        version=HELM_VERSION,
        packages={"helm": "helm.sh/helm/v3/cmd/helm"},
        ldflags=(f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",),
    ),
)


def binary(name: str) -> Path:
    for build in BUILDS:
        if name in build.packages:
            return build.bin_dir / name
    raise KeyError(name)


def log(message: str) -> None:
    print(f"dev-cluster: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# build


class BuildError(RuntimeError):
    pass


class ClusterError(RuntimeError):
    pass


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN="local",  # fail clearly instead of downloading another toolchain
        CGO_ENABLED="0",
        GOFLAGS="-modcacherw -buildvcs=false",  # a read-write module cache can be rm -rf'ed
        GOMODCACHE=str(CACHE_DIR / "go" / "mod"),
        GOCACHE=str(CACHE_DIR / "go" / "build-cache"),
        GOTMPDIR=str(CACHE_DIR / "go" / "tmp"),  # go build's scratch space, /tmp may be small
        GOWORK="off",
    )
    return env


def _lower_priority() -> None:
    os.nice(10)  # the machine has 2 cores shared with everything else


def go(args: list[str], cwd: Path) -> str:
    result = subprocess.run(
        ["go", *args],
        cwd=cwd,
        env=go_env(),
        capture_output=True,
        text=True,
        preexec_fn=_lower_priority,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(f"go {' '.join(args)} failed in {cwd}:\n{result.stderr[-4000:]}")
    return result.stdout


def staging_replaces(build: GoBuild) -> tuple[list[str], list[str]]:
    """The replace lines and godebug lines that k8s.io/kubernetes' own go.mod implies.

    k/k requires each staging module at the fake v0.0.0 and maps it to ./staging/src/...; a
    wrapper module must instead pin each one to its published v0.<minor>.<patch> tag.
    """
    module = f"{build.module}@{build.version}"
    info = json.loads(go(["mod", "download", "-json", module], CACHE_DIR))
    staging_version = "v0." + build.version.split(".", 1)[1]
    replaces, godebugs = [], []
    for line in Path(info["GoMod"]).read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == "=>" and fields[2].startswith("./staging/src/"):
            replaces.append(f"{fields[0]}={fields[0]}@{staging_version}")
        elif fields[:1] == ["godebug"] and len(fields) == 2:
            godebugs.append(fields[1])
    if not replaces:
        raise BuildError(f"no staging replace lines found in {info['GoMod']}")
    return replaces, godebugs


def go_binary_name(package: str) -> str:
    """The file name `go build -o dir/` gives a main package: a /vN suffix does not count."""
    parts = package.split("/")
    return parts[-2] if re.fullmatch(r"v[0-9]+", parts[-1]) else parts[-1]


def build_one(build: GoBuild) -> None:
    if build.is_built():
        return
    start = time.monotonic()
    log(f"building {build.name} {build.version} (minutes with a cold Go cache)")
    shutil.rmtree(build.work_dir, ignore_errors=True)
    build.work_dir.mkdir(parents=True)
    for leftover in build.bin_dir.parent.glob(f".{build.name}-*"):  # from an interrupted build
        shutil.rmtree(leftover)
    go(["mod", "init", "local.invalid/kube-ddp-dev-cluster"], build.work_dir)
    if build.staging_replaces:
        replaces, godebugs = staging_replaces(build)
        go(["mod", "edit", *(f"-replace={r}" for r in replaces)], build.work_dir)
        go(["mod", "edit", *(f"-godebug={g}" for g in godebugs)], build.work_dir)
    go(["get", *(f"{pkg}@{build.version}" for pkg in build.packages.values())], build.work_dir)
    out_dir = Path(tempfile.mkdtemp(prefix=f".{build.name}-", dir=build.bin_dir.parent))
    out_dir.chmod(0o755)  # mkdtemp makes it private
    ldflags = " ".join(("-s", "-w", *build.ldflags))
    build_flags = ["-trimpath", "-p", "2", "-ldflags", ldflags, "-o", f"{out_dir}/"]
    go(["build", *build_flags, *build.packages.values()], build.work_dir)
    for name, package in build.packages.items():
        produced = out_dir / go_binary_name(package)
        if produced != out_dir / name:
            produced.rename(out_dir / name)
    if build.module_files:
        module_dir = go(["list", "-m", "-f", "{{.Dir}}", build.module], build.work_dir).strip()
        for file in build.module_files:
            shutil.copy(Path(module_dir) / file, out_dir / Path(file).name)
    (out_dir / "recipe.json").write_text(build.recipe)
    shutil.rmtree(build.bin_dir, ignore_errors=True)
    out_dir.rename(build.bin_dir)  # atomic: a half-built directory never looks warm
    log(f"built {build.name} {build.version} in {time.monotonic() - start:.0f} s")


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """Serialise builds: a test session and `make cluster-up` may race for a cold cache."""
    (CACHE_DIR / "bin").mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def binaries_ready() -> bool:
    return all(build.is_built() for build in BUILDS)


def build_all() -> None:
    if binaries_ready():
        return
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain (`go`) is not on PATH; it is needed for a cold build")
    with cache_lock():
        (CACHE_DIR / "go" / "tmp").mkdir(parents=True, exist_ok=True)
        for build in BUILDS:
            build_one(build)


# ---------------------------------------------------------------------------------------------
# certificates


def openssl(*args: str) -> None:
    env = dict(os.environ, OPENSSL_CONF="/dev/null")  # no distribution defaults sneak in
    result = subprocess.run(
        ["openssl", *args], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def new_key(path: Path) -> None:
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))


def new_certificate(pki: Path, name: str, subject: str, extensions: list[str]) -> None:
    new_key(pki / f"{name}.key")
    # fmt: off
    openssl(
        "req", "-new", "-key", str(pki / f"{name}.key"), "-subj", subject, "-days", "3650",
        "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-addext", "basicConstraints=critical,CA:FALSE",
        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
        *(arg for extension in extensions for arg in ("-addext", extension)),
        "-out", str(pki / f"{name}.crt"),
    )
    # fmt: on


# Client identities: the controller manager and scheduler use the names the bootstrap RBAC
# policy grants rights to (as kubeadm does); the admin and kwok are cluster admins.
CLIENTS = {
    "admin": "/O=system:masters/CN=kubernetes-admin",
    "kube-controller-manager": "/CN=system:kube-controller-manager",
    "kube-scheduler": "/CN=system:kube-scheduler",
    "kwok": "/O=system:masters/CN=kwok",
}


def make_pki(pki: Path) -> None:
    if shutil.which("openssl") is None:
        raise ClusterError("`openssl` is not on PATH; it makes the cluster's certificates")
    pki.mkdir(parents=True)
    new_key(pki / "ca.key")
    # fmt: off
    openssl(
        "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=kube-ddp-dev-ca",
        "-days", "3650", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", str(pki / "ca.crt"),
    )
    # fmt: on
    new_certificate(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        [
            "extendedKeyUsage=serverAuth",
            "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
            "DNS:kubernetes.default.svc.cluster.local",
        ],
    )
    for name, subject in CLIENTS.items():
        new_certificate(pki, name, subject, ["extendedKeyUsage=clientAuth"])
    new_key(pki / "sa.key")  # signs service-account tokens (TokenRequest and legacy)
    # The apiserver reads a PKCS#8 key only as a private key: verification needs the public half.
    openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


# ---------------------------------------------------------------------------------------------
# the cluster


PKI = STATE_DIR / "pki"
RUN = STATE_DIR / "run"
LOGS = STATE_DIR / "logs"
STATE_FILE = STATE_DIR / "state.json"
KUBECONFIG = STATE_DIR / "kubeconfig"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_kubeconfig(path: Path, server: str, user: str) -> None:
    """A self-contained kubeconfig: certificates are embedded, so the file can be copied."""

    def data(name: str) -> str:
        import base64

        return base64.b64encode((PKI / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kube-ddp-dev",
                "cluster": {"server": server, "certificate-authority-data": data("ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(f"{user}.crt"),
                    "client-key-data": data(f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "kube-ddp-dev", "context": {"cluster": "kube-ddp-dev", "user": user}}
        ],
        "current-context": "kube-ddp-dev",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    path.chmod(0o600)


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
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={PKI / 'sa.pub'}",
            f"--service-account-signing-key-file={PKI / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",  # lighter; no tenants to protect here
            "--profiling=false",
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
        ],
        "kube-scheduler": [
            str(binary("kube-scheduler")),
            *delegated_auth("kube-scheduler"),
            "--profiling=false",
        ],
        "kwok": [
            str(binary("kwok")),
            f"--kubeconfig={RUN / 'kwok.kubeconfig'}",
            f"--config={kwok_stages}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--cidr=10.244.0.0/16",  # fake pod IPs: nothing routes to them
            "--node-ip=10.0.0.1",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-lease-duration-seconds=40",  # kwok renews node leases: nodes stay Ready
        ],
    }


def process_matches(pid: int, argv: list[str]) -> bool:
    """True while `pid` is alive and still runs exactly `argv` (pids get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0")[:-1] == [arg.encode() for arg in argv]


class Component(TypedDict):
    name: str
    pid: int
    argv: list[str]


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


def is_alive(component: Component) -> bool:
    return process_matches(component["pid"], component["argv"])


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


def stop_component(component: Component, grace: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if not is_alive(component):
        return
    os.kill(component["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while is_alive(component) and time.monotonic() < deadline:
        time.sleep(0.05)
        reap(component["pid"])
    if is_alive(component):
        log(f"{component['name']} ignored SIGTERM for {grace:.0f} s; killing it")
        os.kill(component["pid"], signal.SIGKILL)
    reap(component["pid"])


def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start one component in its own session, its output appended to its log."""
    with open(LOGS / f"{name}.log", "ab") as log_file:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives `up`, and a ^C in the terminal
        )


def restart_apiserver() -> float:
    """Stop kube-apiserver and start it again with the same flags (resilience tests); the
    seconds it was unavailable."""
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
        return time.monotonic() - started


def reap(pid: int) -> None:
    # When `up` ran in this very process (the pytest fixture), its children linger as zombies.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def tls_context(*, verify: bool = True) -> ssl.SSLContext:
    if not verify:  # the controller manager and scheduler serve self-signed health endpoints
        return ssl._create_unverified_context()
    context = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    context.load_cert_chain(PKI / "admin.crt", PKI / "admin.key")
    return context


def http_get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), b""
    except (OSError, ssl.SSLError):
        return 0, b""


def wait_until(
    what: str,
    ready: Callable[[], object],
    timeout: float,
    watch: dict[str, subprocess.Popen[bytes]],
) -> None:
    """Poll `ready()` until it is true; fail early when a watched process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        for name, process in watch.items():
            if process.poll() is not None:
                raise ClusterError(
                    f"{name} exited with {process.returncode} while waiting for {what}:\n"
                    + tail(LOGS / f"{name}.log")
                )
        time.sleep(0.1)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}; logs: {LOGS}")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def is_healthy(url: str, context: ssl.SSLContext | None = None) -> bool:
    return http_get(url, context)[0] == 200


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
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            start(name)
        unverified = tls_context(verify=False)
        health = {
            "kube-controller-manager": (
                f"https://127.0.0.1:{ports['kube-controller-manager']}",
                unverified,
            ),
            "kube-scheduler": (f"https://127.0.0.1:{ports['kube-scheduler']}", unverified),
            "kwok": (f"http://127.0.0.1:{ports['kwok']}", None),
        }
        for name, (base_url, context) in health.items():
            check = functools.partial(is_healthy, f"{base_url}/healthz", context)
            wait_until(name, check, 60, {name: processes[name]})
        expected_nodes = (HACK / "nodes.yaml").read_text().count("\nkind: Node")
        wait_until(
            f"{expected_nodes} Ready nodes",
            lambda: nodes_ready(server, expected_nodes),
            60,
            processes,
        )
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


def kubectl(*args: str) -> str:
    result = subprocess.run(
        [str(binary("kubectl")), f"--kubeconfig={KUBECONFIG}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def down() -> bool:
    """Stop what `up` started; True when something was running."""
    with state_lock():
        state = read_state()
        was_running = bool(state and any(is_alive(c) for c in state["components"]))
        stop_processes(state)
        with contextlib.suppress(FileNotFoundError):
            STATE_FILE.unlink()
    return was_running


# ---------------------------------------------------------------------------------------------
# command line


def cmd_build(_: argparse.Namespace) -> int:
    build_all()
    for build in BUILDS:
        print(f"{build.name} {build.version}: {build.bin_dir}")
    return 0


def cmd_up(_: argparse.Namespace) -> int:
    state = up()
    print(f"cluster running at {state['server']}")
    print(f"  export KUBECONFIG={KUBECONFIG}")
    print(f"  export PATH={STATE_DIR / 'bin'}:$PATH")
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    print("cluster stopped" if down() else "cluster was not running")
    return 0


def resident_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    state = read_state()
    if not state:
        print("cluster is not running")
        return 1
    print(f"server {state['server']}  kubeconfig {state['kubeconfig']}  owner {state['owner']}")
    all_alive, total_mib = True, 0
    for component in state["components"]:
        alive = is_alive(component)
        all_alive &= alive
        total_mib += resident_mib(component["pid"]) if alive else 0
        word = f"running, {resident_mib(component['pid'])} MiB resident" if alive else "DEAD"
        print(f"  {component['name']:<24} pid {component['pid']:<8} {word}")
    print(f"  {'total':<37} {total_mib} MiB resident")
    if not all_alive:
        print("some components are dead: `up` cleans up and starts afresh")
    return 0 if all_alive else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, func, help_text in (
        ("build", cmd_build, "build the pinned binaries into the cache (no-op when warm)"),
        ("up", cmd_up, "start the cluster (no-op when it runs)"),
        ("down", cmd_down, "stop the processes `up` started"),
        ("status", cmd_status, "say what runs"),
    ):
        commands.add_parser(name, help=help_text).set_defaults(func=func)
    args = parser.parse_args()
    try:
        return int(args.func(args))
    except (BuildError, ClusterError) as error:
        log(str(error))
        return 1


if __name__ == "__main__":
    sys.exit(main())
