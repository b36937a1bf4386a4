"""Where the e2e tier runs its real pods, and how the project's code gets into them.

- `DevPlatform` (the default): the dev cluster (hack/devcluster) with its real node. The
  operator runs from its own image, built from the repository's Dockerfile (cached by the
  digest of its sources). No image registry can be reached and a trainer image is 6 GB (PyPI's
  torch is the CUDA build), so the workers run the tiny `localhost/hostusr:local` image with
  the host's /usr (and /etc/alternatives, through which Debian links commands), its Python
  and this repository (with its .venv) mounted read-only: the same code as the tests. The
  image stands in for the trainer image's user (uid 10001, home and working directory
  /home/trainer, hack/devcluster/images.py), so the workers run as that user, non-root, as
  they would from the real image: the host's /root is 0700, but only the Python installation
  below it is mounted, at the same path under the image's own /root (0755).
  In a namespace that enforces the `restricted` Pod Security Standard (`Platform.restricted`),
  which refuses hostPath volumes in a pod, the same directories come through
  PersistentVolumeClaims bound to read-only hostPath PersistentVolumes made for the namespace.
- `ExternalPlatform`: any cluster with a real node, given by KUBEDDP_E2E_KUBECONFIG, running the
  project's own images (KUBEDDP_E2E_OPERATOR_IMAGE, KUBEDDP_E2E_TRAINER_IMAGE), e.g. kind in
  the GitHub workflow. KUBEDDP_E2E_NODE_EXEC (e.g. `docker exec kind-worker`) lets a test
  reach the node's processes.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ddp_trainer import contract
from tests.cluster.support import REPO, Cluster, enforce

IMAGE_OWNER = f"{contract.IMAGE_UID}:{contract.IMAGE_GID}"  # the trainer image's user

JobSpec = Callable[[dict[str, Any]], dict[str, Any]]  # a job's spec, completed for the platform
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` into `base`: dictionaries merged, lists concatenated, the rest replaced."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        elif isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = [*merged[key], *value]
        else:
            merged[key] = value
    return merged


@dataclass
class Platform:
    cluster: Cluster
    helm: Path
    # What every job's spec gets, so its pods land on the real node and can run our code.
    job_overrides: dict[str, Any] = field(default_factory=dict)
    helm_args: list[str] = field(default_factory=list)

    def job_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        return _merge(self.job_overrides, spec)

    # Where scratch_volume's directories are on the node, one folder per namespace.
    scratch_root: ClassVar[Path] = Path("/tmp/kube-ddp-e2e")

    def scratch_volume(self, name: str, namespace: str) -> dict[str, Any]:
        """A directory on the node that survives the job's pods (checkpoints)."""
        path = str(self.scratch_root / namespace / name)
        return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}

    def kill(self, pod: Any, sig: signal.Signals = signal.SIGKILL) -> None:
        """SIGKILL the pod's main process from the node, as the kernel's OOM killer would (a
        container's PID 1 ignores SIGKILL sent from inside its own PID namespace); or send it
        `sig` (SIGSTOP: a hung rank)."""
        raise NotImplementedError

    def kill_rank(self, pod: Any, sig: signal.Signals = signal.SIGKILL) -> None:
        """SIGKILL the rank(s) the pod's main process (the agent, ddp_trainer.torchrun) started,
        from the node: a rank that crashes in a pod that stays."""
        raise NotImplementedError

    @contextmanager
    def restricted(self, namespace: str) -> Iterator[JobSpec]:
        """`namespace` enforcing the restricted Pod Security Standard; yields the job_spec for
        it."""
        enforce(self.cluster, namespace, "restricted")
        yield self.job_spec


@dataclass
class DevPlatform(Platform):
    # The host's directories every worker mounts read-only, by volume name.
    mounts: dict[str, Path] = field(default_factory=dict)

    def scratch_volume(self, name: str, namespace: str) -> dict[str, Any]:
        """Made here (the node is this machine) and owned by the image's user: the kubelet
        would make a hostPath directory root's, and fsGroup does not reach hostPath."""
        volume = super().scratch_volume(name, namespace)
        path = Path(volume["hostPath"]["path"])
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, contract.IMAGE_UID, contract.IMAGE_GID)
        return volume

    @contextmanager
    def restricted(self, namespace: str) -> Iterator[JobSpec]:
        """The host's directories through claims: a PersistentVolume (hostPath, read-only,
        bound to its claim ahead) per directory, removed with the namespace's claims."""
        enforce(self.cluster, namespace, "restricted")
        core = self.cluster.core
        size = {"storage": "1Gi"}
        made = []
        try:
            for name, path in self.mounts.items():
                volume = f"{namespace}-{name}"
                core.create_persistent_volume(
                    {
                        "metadata": {"name": volume, "labels": {"kubeddp.io/test": "true"}},
                        "spec": {
                            "capacity": size,
                            "accessModes": ["ReadOnlyMany"],
                            "storageClassName": "",
                            "hostPath": {"path": str(path), "type": "Directory"},
                            "claimRef": {"namespace": namespace, "name": name},
                        },
                    }
                )
                made.append(volume)
                core.create_namespaced_persistent_volume_claim(
                    namespace,
                    {
                        "metadata": {"name": name},
                        "spec": {
                            "accessModes": ["ReadOnlyMany"],
                            "storageClassName": "",
                            "volumeName": volume,
                            "resources": {"requests": size},
                        },
                    },
                )
            claims = [
                {"name": n, "persistentVolumeClaim": {"claimName": n, "readOnly": True}}
                for n in self.mounts
            ]
            overrides = {
                **self.job_overrides,
                "template": {**self.job_overrides["template"], "volumes": claims},
            }
            yield lambda spec: _merge(overrides, spec)
        finally:
            for volume in made:  # gone once its claim goes with the namespace
                core.delete_persistent_volume(volume)

    def kill(self, pod: Any, sig: signal.Signals = signal.SIGKILL) -> None:
        os.kill(container_pid(pod), sig)

    def kill_rank(self, pod: Any, sig: signal.Signals = signal.SIGKILL) -> None:
        agent = container_pid(pod)
        ranks = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
        assert ranks, f"{pod.metadata.name}: its agent (pid {agent}) runs no rank"
        for rank in ranks:
            os.kill(int(rank), sig)


def container_pid(pod: Any) -> int:
    """The host's process id of the pod's first container's main process (dev cluster: the
    real node is this machine)."""
    container_id = pod.status.container_statuses[0].container_id.split("://")[-1]
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import node

    listed = subprocess.run(
        [*node.ctr(), "tasks", "list"], capture_output=True, text=True, check=True
    ).stdout
    return next(int(row.split()[1]) for row in listed.splitlines() if row.startswith(container_id))


@dataclass
class ExternalPlatform(Platform):
    node_exec: list[str] = field(default_factory=list)

    def kill(self, pod: Any, sig: signal.Signals = signal.SIGKILL) -> None:
        self._on_node(pod, f"kill -{int(sig)} $main")

    def kill_rank(self, pod: Any, sig: signal.Signals = signal.SIGKILL) -> None:
        self._on_node(pod, f"kill -{int(sig)} $(cat /proc/$main/task/$main/children)")

    def scratch_volume(self, name: str, namespace: str) -> dict[str, Any]:
        """Made on the node and owned by the image's user, as DevPlatform's: the kubelet would
        make a hostPath directory root's, and fsGroup does not reach hostPath."""
        volume = super().scratch_volume(name, namespace)
        path = volume["hostPath"]["path"]
        self._on_the_node(f"mkdir -p {path} && chown {IMAGE_OWNER} {path}")
        return volume

    def _on_node(self, pod: Any, script: str) -> None:
        """Run `script` on the pod's node, `$main` the pid of its container's main process
        (containerd's task list: crictl is not on every node image)."""
        container_id = pod.status.container_statuses[0].container_id.split("://")[-1]
        pid = f"ctr -n k8s.io tasks list | awk '$1 == \"{container_id}\" {{print $2}}'"
        self._on_the_node(f"main=$({pid}); {script}")

    def _on_the_node(self, script: str) -> None:
        if not self.node_exec:
            raise AssertionError("set KUBEDDP_E2E_NODE_EXEC to reach the node's processes")
        subprocess.run([*self.node_exec, "sh", "-c", script], check=True)


def dev_platform(cluster: Cluster, helm: Path) -> DevPlatform:
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import images, node

    job_overrides = dev_job_overrides()
    mounts = dev_mounts()
    # The operator runs from its own image, built from the Dockerfile (devcluster.images).
    images.import_operator_image(node.ctr())
    repository, tag = images.OPERATOR_IMAGE.rsplit(":", 1)
    on_real_node = job_overrides["template"]
    helm_args = [
        *("--set", f"image.repository={repository}", "--set", f"image.tag={tag}"),
        *("--set", "image.pullPolicy=Never", "--set", "operator.logFormat=plain"),
        *("--set-json", f"nodeSelector={json.dumps(on_real_node['nodeSelector'])}"),
        *("--set-json", f"tolerations={json.dumps(on_real_node['tolerations'])}"),
    ]
    return DevPlatform(cluster, helm, job_overrides, helm_args, mounts)


def dev_mounts() -> dict[str, Path]:
    """The host's directories every worker on the real node mounts read-only, by volume name.
    /etc/alternatives: Debian's commands such as mpirun and awk are links through it."""
    mounts = {"usr": Path("/usr"), "alternatives": Path("/etc/alternatives"), "repo": REPO}
    if not Path(sys.base_prefix).is_relative_to("/usr"):
        mounts["python"] = Path(sys.base_prefix)
    return mounts


def dev_job_overrides() -> dict[str, Any]:
    """What puts a job's pods on the dev cluster's real node, running this repository."""
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import images, node

    venv = Path(sys.prefix)
    mounts = dev_mounts()
    volumes = [
        {"name": n, "hostPath": {"path": str(p), "type": "Directory"}} for n, p in mounts.items()
    ]
    volume_mounts = [{"name": n, "mountPath": str(p), "readOnly": True} for n, p in mounts.items()]
    on_real_node = {
        "nodeSelector": {node.NODE_LABEL[0]: node.NODE_LABEL[1]},
        "tolerations": [{"key": node.NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }
    job_overrides = {
        "image": images.HOST_USR_IMAGE,
        "imagePullPolicy": "Never",
        "env": [{"name": "PATH", "value": f"{venv / 'bin'}:{DEFAULT_PATH}"}],
        "template": {
            **on_real_node,
            "volumes": volumes,
            "volumeMounts": volume_mounts,
        },
    }
    return job_overrides


def external_platform(cluster: Cluster, helm: Path) -> ExternalPlatform:
    operator_image = os.environ["KUBEDDP_E2E_OPERATOR_IMAGE"]
    repository, tag = operator_image.rsplit(":", 1)
    return ExternalPlatform(
        cluster,
        helm,
        job_overrides={"image": os.environ["KUBEDDP_E2E_TRAINER_IMAGE"]},
        helm_args=["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"],
        node_exec=shlex.split(os.environ.get("KUBEDDP_E2E_NODE_EXEC", "")),
    )
