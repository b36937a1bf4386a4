"""Build the pinned upstream binaries from their published Go modules, into the cache.

Each component is a throwaway wrapper module (`go mod init`, `go get <main packages>@<version>`)
built with `go build -trimpath`; binaries land in CACHE_DIR/bin/<name>-<version>/ with the
recipe that made them, renamed into place atomically, one build at a time (a file lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from devcluster.paths import CACHE_DIR, BuildError, log

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
# The Kubernetes version Helm assumes without a cluster (`helm template`, `helm lint`): its
# release build stamps the minor of the k8s.io/client-go in its go.mod (v0.37.0 -> 1.37).
HELM_KUBERNETES_MINOR = "37"
COREDNS_VERSION = "v1.15.0"
# What the real node's Corefile (node.corefile) and kubeadm's default one (kind) use.
COREDNS_PLUGINS = (
    "bind",
    "cache",
    "errors",
    "forward",
    "health",
    "kubernetes",
    "loadbalance",
    "loop",
    "prometheus",
    "ready",
    "reload",
)
# The wrapper module's path, and the package of its own main (GoBuild.plugins).
WRAPPER_MODULE = "local.invalid/kube-ddp-dev-cluster"
OWN_MAIN = "."

ACTIONLINT_VERSION = "v1.7.12"
# The newest the module proxy serves (v0.8.1 is refused; `@latest` wrongly says v0.6.0).
MPI_OPERATOR_VERSION = "v0.8.2"
MPI_OPERATOR_MODULE = "github.com/kubeflow/mpi-operator"
MPIJOB_CRD_FILE = "./manifests/base/kubeflow.org_mpijobs.yaml"  # in the module
KUEUE_VERSION = "v0.19.2"
# Read, not built: the PodGroup CRDs of the two gang schedulers that are not Kubernetes' own.
SCHEDULER_PLUGINS_VERSION = "v0.34.7"
VOLCANO_VERSION = "v1.14.1"  # the proxy refuses v1.14.0 of volcano.sh/volcano
# Kubeflow's Training Operator v1 (PyTorchJob), a peer of `make bench` (devcluster.peers); the
# newest the module proxy serves, tagged in the renamed repository kubeflow/trainer.
TRAINING_OPERATOR_VERSION = "v1.9.4"
TRAINING_OPERATOR_MODULE = "github.com/kubeflow/training-operator"
# promtool checks and unit-tests the chart's PrometheusRule (tests/cluster/test_operations_kit.py):
# Debian 12's, whose 2.42 reads our rules and runs their tests as Prometheus 3.16 does, in
# seconds where a build from the Go module took 8 to 14 minutes on a new machine.
PROMETHEUS_DEBIAN_PACKAGE = "prometheus"
PROMETHEUS_DEBIAN_VERSION = "2.42.0+ds-5+deb12u1"
# NetworkPolicy enforcement on the real node: kube-router's firewall alone (iptables, ipset).
# The proxy refuses its /v2 module path; v1.6.1 is the newest it serves.
KUBE_ROUTER_VERSION = "v1.6.1"
PYTORCHJOB_CRD_FILE = "./manifests/base/crds/kubeflow.org_pytorchjobs.yaml"  # in the module
# Kubeflow Trainer v2 (TrainJob) and the JobSet controller its TrainJobs run on
# (devcluster.kubeflow_trainer), a peer of `make bench`: the newest Trainer the module proxy
# serves (v2.3.1 and v2.4.x are refused), and the JobSet version its go.mod asks for.
TRAINER_VERSION = "v2.3.0"
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
TRAINER_CRDS = ("trainjobs", "trainingruntimes", "clustertrainingruntimes")
TRAINER_RUNTIME_FILE = "./manifests/base/runtimes/torch_distributed.yaml"  # in the module
JOBSET_VERSION = "v0.12.0"
JOBSET_MODULE = "sigs.k8s.io/jobset"
JOBSET_CRD_FILE = "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
# An S3-compatible object store for the checkpoint tests (tests/s3_server.py): one binary that
# serves a directory.
VERSITYGW_VERSION = "v1.8.0"
VERSITYGW_MODULE = "github.com/versity/versitygw"
# The kind path (devcluster.kind): kind itself, and a node image assembled from our builds.
KIND_VERSION = "v0.33.0"
KIND_MODULE = "sigs.k8s.io/kind"


def cached(bin_dir: Path, recipe: str, files: list[str]) -> bool:
    """Whether `bin_dir` was made by `recipe` and holds every one of `files`."""
    try:
        same_recipe = (bin_dir / "recipe.json").read_text() == recipe
    except OSError:
        return False
    return same_recipe and all((bin_dir / name).is_file() for name in files)


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
    # Start the wrapper's go.sum from the module's own: the checksum database lacks some of
    # Kueue's dependencies (sigs.k8s.io/scheduler-library v0.1.0-alpha1: 404).
    module_go_sum: bool = False
    # CoreDNS: a main package of our own that links only these plugins (by their plugin.cfg
    # names), in the order the module's plugin.cfg gives them, where the module's own main
    # links all ~60 (cloud SDKs, tracers) and takes minutes more to build. Empty: not so built.
    plugins: tuple[str, ...] = ()

    @property
    def bin_dir(self) -> Path:
        return CACHE_DIR / "bin" / f"{self.name}-{self.version}"

    @property
    def work_dir(self) -> Path:
        return CACHE_DIR / "build" / f"{self.name}-{self.version}"

    @property
    def recipe(self) -> str:
        """Written next to the binaries: a changed recipe (flags, say) means a rebuild."""
        recipe = dataclasses.asdict(self)
        for unset in ("module_go_sum", "plugins"):  # the recipe of the builds without them
            if not recipe[unset]:
                del recipe[unset]
        return json.dumps(recipe, indent=2, sort_keys=True)

    def is_built(self) -> bool:
        wanted = [*self.packages, *(Path(f).name for f in self.module_files)]
        return cached(self.bin_dir, self.recipe, wanted)


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


def _helm_ldflags() -> tuple[str, ...]:
    # As Helm's Makefile sets them; without the last four helm believes in Kubernetes v1.20.0
    # and refuses a chart's kubeVersion unless --kube-version is passed.
    flags = [
        f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    ]
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [
            f"-X {pkg}.k8sVersionMajor=1",
            f"-X {pkg}.k8sVersionMinor={HELM_KUBERNETES_MINOR}",
        ]
    return tuple(flags)


# The control plane, what `up` starts: all a cold cache builds before the first test that
# needs a cluster (kwok's nodes stand in for kubelets).
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
            )
        ),
    ),
)

KUEUE_CRDS = (
    "admissionchecks",
    "clusterqueues",
    "cohorts",
    "localqueues",
    "multikueueclusters",
    "multikueueconfigs",
    "provisioningrequestconfigs",
    "resourceflavors",
    "topologies",
    "workloadpriorityclasses",
    "workloads",
)

# Built only when something asks for them (`built`), not by `build_all`: the cluster runs
# without them, and their cold builds take minutes (Kueue's the longest).
ADDONS = (
    GoBuild(
        name="kubelet",  # the real node's (devcluster.node), a build of its own
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        packages={"kubelet": "k8s.io/kubernetes/cmd/kubelet"},
        ldflags=_kubernetes_ldflags(KUBERNETES_VERSION),
        staging_replaces=True,
    ),
    GoBuild(
        name="helm",
        module="helm.sh/helm/v3",
        version=HELM_VERSION,
        packages={"helm": "helm.sh/helm/v3/cmd/helm"},
        ldflags=_helm_ldflags(),
    ),
    GoBuild(
        name="mpi-operator",  # launcher: mpi jobs run through it (devcluster.mpioperator)
        module=MPI_OPERATOR_MODULE,
        version=MPI_OPERATOR_VERSION,
        packages={"mpi-operator": f"{MPI_OPERATOR_MODULE}/cmd/mpi-operator"},
        ldflags=(f"-X {MPI_OPERATOR_MODULE}/pkg/version.Version={MPI_OPERATOR_VERSION}",),
        module_files=(MPIJOB_CRD_FILE,),  # its CRD, from the module: never a copy in the repo
    ),
    GoBuild(
        name="actionlint",  # `make lint` checks the GitHub workflow with it
        module="github.com/rhysd/actionlint",
        version=ACTIONLINT_VERSION,
        packages={"actionlint": "github.com/rhysd/actionlint/cmd/actionlint"},
        ldflags=(f"-X github.com/rhysd/actionlint.version={ACTIONLINT_VERSION}",),
    ),
    GoBuild(
        name="coredns",  # the real node's cluster DNS, and the kind node image's
        module="github.com/coredns/coredns",
        version=COREDNS_VERSION,
        packages={"coredns": OWN_MAIN},
        plugins=COREDNS_PLUGINS,
    ),
    GoBuild(
        name="kube-router",  # tests/e2e/test_network_policy.py runs its firewall on the host
        module="github.com/cloudnativelabs/kube-router",
        version=KUBE_ROUTER_VERSION,
        packages={"kube-router": "github.com/cloudnativelabs/kube-router/cmd/kube-router"},
        module_go_sum=True,
    ),
    GoBuild(
        name="kueue",  # devcluster.kueue runs it out of cluster, for tests/cluster/test_kueue.py
        module="sigs.k8s.io/kueue",
        version=KUEUE_VERSION,
        packages={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
        module_go_sum=True,
        # Its CRDs and webhook configurations, from the same module version.
        module_files=(
            *(f"config/components/crd/bases/kueue.x-k8s.io_{crd}.yaml" for crd in KUEUE_CRDS),
            "config/components/webhook/manifests.yaml",
        ),
    ),
    GoBuild(
        name="training-operator",  # devcluster.peers: `make bench` and its smoke test
        module=TRAINING_OPERATOR_MODULE,
        version=TRAINING_OPERATOR_VERSION,
        packages={"training-operator": f"{TRAINING_OPERATOR_MODULE}/cmd/training-operator.v1"},
        module_files=(PYTORCHJOB_CRD_FILE,),  # its CRD, from the module: never a copy in the repo
    ),
    GoBuild(
        name="jobset",  # devcluster.kubeflow_trainer: `make bench` and its smoke test
        module=JOBSET_MODULE,
        version=JOBSET_VERSION,
        packages={"jobset": JOBSET_MODULE},
        ldflags=(f"-X {JOBSET_MODULE}/pkg/version.GitVersion={JOBSET_VERSION}",),
        module_files=(JOBSET_CRD_FILE, "config/components/webhook/manifests.yaml"),
    ),
    GoBuild(
        name="kubeflow-trainer",  # devcluster.kubeflow_trainer, beside JobSet
        module=TRAINER_MODULE,
        version=TRAINER_VERSION,
        packages={"trainer-controller-manager": f"{TRAINER_MODULE}/cmd/trainer-controller-manager"},
        module_files=(
            *(f"./manifests/base/crds/trainer.kubeflow.org_{crd}.yaml" for crd in TRAINER_CRDS),
            "./manifests/base/webhook/manifests.yaml",
            TRAINER_RUNTIME_FILE,
        ),
    ),
    GoBuild(
        name="kind",
        module=KIND_MODULE,
        version=KIND_VERSION,
        packages={"kind": KIND_MODULE},
    ),
    GoBuild(
        name="kind-node",  # what a kind node runs beside the control plane's binaries
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        packages={
            binary: f"k8s.io/kubernetes/cmd/{binary}" for binary in ("kubeadm", "kube-proxy")
        },
        ldflags=_kubernetes_ldflags(KUBERNETES_VERSION),
        staging_replaces=True,
    ),
    GoBuild(
        name="versitygw",
        module=VERSITYGW_MODULE,
        version=VERSITYGW_VERSION,
        packages={"versitygw": f"{VERSITYGW_MODULE}/cmd/versitygw"},
    ),
)


@dataclasses.dataclass(frozen=True)
class DebianBinary:
    """A binary taken out of one of Debian's packages (apt-get download, dpkg-deb -x), not
    installed: where Debian's version does the job, it costs seconds, not a build, and starts
    no service (the prometheus package's would start a server)."""

    name: str
    package: str
    version: str
    path: str  # inside the package

    @property
    def packages(self) -> dict[str, str]:
        return {self.name: self.path}

    @property
    def bin_dir(self) -> Path:
        return CACHE_DIR / "bin" / f"{self.name}-debian-{self.version}"

    @property
    def recipe(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def is_built(self) -> bool:
        return cached(self.bin_dir, self.recipe, [self.name])


FROM_DEBIAN = (
    DebianBinary(
        name="promtool",
        package=PROMETHEUS_DEBIAN_PACKAGE,
        version=PROMETHEUS_DEBIAN_VERSION,
        path="usr/bin/promtool",
    ),
)


def binary(name: str) -> Path:
    for build in (*BUILDS, *ADDONS, *FROM_DEBIAN):
        if name in build.packages:
            return build.bin_dir / name
    raise KeyError(name)


def fetch_from_debian(binary: DebianBinary) -> None:
    """The package's file into the cache; `apt-get update` first when the lists lack it."""
    start = time.monotonic()
    log(f"taking {binary.name} from Debian's {binary.package} {binary.version}")
    wanted = f"{binary.package}={binary.version}"
    with tempfile.TemporaryDirectory(prefix=f".{binary.name}-", dir=CACHE_DIR / "bin") as tmp:
        download = ["apt-get", "download", "-qq", wanted]
        if subprocess.run(download, cwd=tmp, capture_output=True, check=False).returncode:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False)
            done = subprocess.run(download, cwd=tmp, capture_output=True, text=True, check=False)
            if done.returncode:
                raise BuildError(f"apt-get download {wanted} failed: {done.stderr[-2000:]}")
        (deb,) = Path(tmp).glob("*.deb")
        unpacked = Path(tmp) / "unpacked"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
        out_dir = Path(tmp) / "out"
        out_dir.mkdir(mode=0o755)
        shutil.copy(unpacked / binary.path, out_dir / binary.name)
        (out_dir / "recipe.json").write_text(binary.recipe)
        shutil.rmtree(binary.bin_dir, ignore_errors=True)
        out_dir.rename(binary.bin_dir)  # atomic: a half-copied directory never looks warm
    log(f"took {binary.name} from Debian in {time.monotonic() - start:.0f} s")


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


# The machine has 2 cores shared with everything else: builds yield them (a nice value, not an
# increment, so a build started from an already lowered thread is not lowered twice), unless
# KUBEDDP_BUILD_NICE says otherwise: 0 for a session whose tests all wait for its builds.
BUILD_NICE = int(os.environ.get("KUBEDDP_BUILD_NICE") or 10)


def _lower_priority() -> None:
    os.setpriority(os.PRIO_PROCESS, 0, max(BUILD_NICE, os.getpriority(os.PRIO_PROCESS, 0)))


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


def module_dir(module: str, version: str) -> Path:
    """The module's files in the Go module cache, downloaded when missing (read-only use)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    (CACHE_DIR / "go" / "tmp").mkdir(parents=True, exist_ok=True)
    info = json.loads(go(["mod", "download", "-json", f"{module}@{version}"], CACHE_DIR))
    return Path(info["Dir"])


def go_binary_name(package: str) -> str:
    """The file name `go build -o dir/` gives a main package: a /vN suffix does not count."""
    parts = (WRAPPER_MODULE if package == OWN_MAIN else package).split("/")
    return parts[-2] if re.fullmatch(r"v[0-9]+", parts[-1]) else parts[-1]


def chosen_plugins(module: str, plugin_cfg: str, plugins: tuple[str, ...]) -> dict[str, str]:
    """Each of `plugins` and its import path, in the order plugin.cfg lists them: the order in
    which a query passes them. A `name:package` line's package without a slash lies under the
    module's plugin/."""
    listed = {}
    for line in plugin_cfg.splitlines():
        name, _, package = line.strip().partition(":")
        if name and not name.startswith("#") and package:
            listed[name] = package if "/" in package else f"{module}/plugin/{package}"
    unknown = sorted(set(plugins) - set(listed))
    if unknown:
        raise BuildError(f"plugin.cfg of {module} lists no {', '.join(unknown)}")
    return {name: package for name, package in listed.items() if name in plugins}


def plugins_main(module: str, chosen: dict[str, str]) -> str:
    """A CoreDNS main that links only the `chosen` plugins and runs them in that order."""
    imports = "".join(f'\t_ "{package}"\n' for package in chosen.values())
    directives = "".join(f'\t\t"{name}",\n' for name in chosen)
    return (
        "package main\n\nimport (\n"
        f'\t"{module}/core/dnsserver"\n\t"{module}/coremain"\n{imports})\n\n'
        f"func init() {{\n\tdnsserver.Directives = []string{{\n{directives}\t}}\n}}\n\n"
        "func main() {\n\tcoremain.Run()\n}\n"
    )


def build_one(build: GoBuild) -> None:
    if build.is_built():
        return
    start = time.monotonic()
    log(f"building {build.name} {build.version} (minutes with a cold Go cache)")
    shutil.rmtree(build.work_dir, ignore_errors=True)
    build.work_dir.mkdir(parents=True)
    for leftover in build.bin_dir.parent.glob(f".{build.name}-*"):  # from an interrupted build
        shutil.rmtree(leftover)
    go(["mod", "init", WRAPPER_MODULE], build.work_dir)
    if build.staging_replaces:
        replaces, godebugs = staging_replaces(build)
        go(["mod", "edit", *(f"-replace={r}" for r in replaces)], build.work_dir)
        go(["mod", "edit", *(f"-godebug={g}" for g in godebugs)], build.work_dir)
    if build.module_go_sum:
        shutil.copy(module_dir(build.module, build.version) / "go.sum", build.work_dir / "go.sum")
    wanted = list(build.packages.values())
    if build.plugins:
        cfg = (module_dir(build.module, build.version) / "plugin.cfg").read_text()
        chosen = chosen_plugins(build.module, cfg, build.plugins)
        (build.work_dir / "main.go").write_text(plugins_main(build.module, chosen))
        core = (f"{build.module}/core/dnsserver", f"{build.module}/coremain")
        wanted = [*core, *(p for p in chosen.values() if p.startswith(f"{build.module}/"))]
    go(["get", *(f"{pkg}@{build.version}" for pkg in wanted)], build.work_dir)
    out_dir = Path(tempfile.mkdtemp(prefix=f".{build.name}-", dir=build.bin_dir.parent))
    out_dir.chmod(0o755)  # mkdtemp makes it private
    ldflags = " ".join(("-s", "-w", *build.ldflags))
    # -w leaves the debug info out of the binary; -dwarf=false does not make it in the first
    # place: about a sixth less CPU for a cold build, the same binary (so not in the recipe).
    no_dwarf = "-gcflags=all=-dwarf=false"
    build_flags = ["-trimpath", "-p", "2", no_dwarf, "-ldflags", ldflags, "-o", f"{out_dir}/"]
    go(["build", *build_flags, *build.packages.values()], build.work_dir)
    for name, package in build.packages.items():
        produced = out_dir / go_binary_name(package)
        if produced != out_dir / name:
            produced.rename(out_dir / name)
    if build.module_files:
        source = go(["list", "-m", "-f", "{{.Dir}}", build.module], build.work_dir).strip()
        for file in build.module_files:
            shutil.copy(Path(source) / file, out_dir / Path(file).name)
    (out_dir / "recipe.json").write_text(build.recipe)
    shutil.rmtree(build.bin_dir, ignore_errors=True)
    out_dir.rename(build.bin_dir)  # atomic: a half-built directory never looks warm
    log(f"built {build.name} {build.version} in {time.monotonic() - start:.0f} s")


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Serialise the builds of one component: test sessions side by side (two lanes of `make
    test`) and `make cluster-up` may race for a cold cache. Builds of different components run
    at once (Go's module and build caches take concurrent users)."""
    locks = CACHE_DIR / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (CACHE_DIR / "bin").mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def built(name: str) -> Path:
    """The binary `name`, building (or taking from Debian) only its own component when the
    cache lacks it."""
    taken = next((b for b in FROM_DEBIAN if name in b.packages), None)
    if taken is not None:
        if not taken.is_built():
            with cache_lock(taken.name):
                if not taken.is_built():
                    fetch_from_debian(taken)
        return taken.bin_dir / name
    build = next(b for b in (*BUILDS, *ADDONS) if name in b.packages)
    if not build.is_built():
        if shutil.which("go") is None:
            raise BuildError(f"the Go toolchain (`go`) is not on PATH; it builds {name}")
        with cache_lock(build.name):
            (CACHE_DIR / "go" / "tmp").mkdir(parents=True, exist_ok=True)
            build_one(build)
    return build.bin_dir / name


def binaries_ready() -> bool:
    return all(build.is_built() for build in BUILDS)


def build_all() -> None:
    """The control plane's binaries (`BUILDS`)."""
    if binaries_ready():
        return
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain (`go`) is not on PATH; it is needed for a cold build")
    for build in BUILDS:
        built(next(iter(build.packages)))
