"""Where the e2e tier runs its real pods, and how the project's code gets into them.

- `DevPlatform` (the default): the dev cluster (hack/devcluster) with its real node. The
  operator runs from its own image, built from the repository's Dockerfile (cached by the
  digest of its sources). No image registry can be reached and a trainer image is 6 GB (PyPI's
  torch is the CUDA build), so the workers run the tiny `localhost/hostusr:local` image with
  the host's /usr (and /etc/alternatives, through which Debian links commands), its Python
  and this repository (with its .venv) mounted read-only: the same code as the tests. They run
  as root because the host's Python lives under /root (0700).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.support import REPO, Cluster

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

    def scratch_volume(self, name: str, namespace: str) -> dict[str, Any]:
        """A directory on the node that survives the job's pods (checkpoints)."""
        path = f"/tmp/kube-ddp-e2e/{namespace}/{name}"
        return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}

    def kill(self, pod: Any) -> None:
        """SIGKILL the pod's main process from the node, as the kernel's OOM killer would (a
        container's PID 1 ignores SIGKILL sent from inside its own PID namespace)."""
        raise NotImplementedError


@dataclass
class DevPlatform(Platform):
    def kill(self, pod: Any) -> None:
        container_id = pod.status.container_statuses[0].container_id.split("://")[-1]
        sys.path.insert(0, str(REPO / "hack"))
        from devcluster import node

        listed = subprocess.run(
            [*node.ctr(), "tasks", "list"], capture_output=True, text=True, check=True
        ).stdout
        pid = next(
            int(row.split()[1]) for row in listed.splitlines() if row.startswith(container_id)
        )
        os.kill(pid, signal.SIGKILL)


@dataclass
class ExternalPlatform(Platform):
    node_exec: list[str] = field(default_factory=list)

    def kill(self, pod: Any) -> None:
        if not self.node_exec:
            raise AssertionError("set KUBEDDP_E2E_NODE_EXEC to reach the node's processes")
        container_id = pod.status.container_statuses[0].container_id.split("://")[-1]
        script = (
            f"kill -9 $(crictl inspect --output go-template --template '{{{{.info.pid}}}}' "
            f"{container_id})"
        )
        subprocess.run([*self.node_exec, "sh", "-c", script], check=True)


def dev_platform(cluster: Cluster, helm: Path) -> DevPlatform:
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import images, node

    job_overrides = dev_job_overrides()
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
    return DevPlatform(cluster, helm, job_overrides, helm_args)


def dev_job_overrides() -> dict[str, Any]:
    """What puts a job's pods on the dev cluster's real node, running this repository."""
    sys.path.insert(0, str(REPO / "hack"))
    from devcluster import images, node

    venv = Path(sys.prefix)
    # /etc/alternatives: Debian's commands such as mpirun and awk are links through it.
    mounts = {"usr": Path("/usr"), "alternatives": Path("/etc/alternatives"), "repo": REPO}
    if not Path(sys.base_prefix).is_relative_to("/usr"):
        mounts["python"] = Path(sys.base_prefix)
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
            "securityContext": {"runAsUser": 0},
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
