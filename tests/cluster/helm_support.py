"""Helpers of the chart tests: the dev cluster's helm binary, ServiceAccount kubeconfigs, and
`kube-ddp operator` processes run with exactly the chart's rights."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.operator_support import service_account_token
from tests.cluster.support import REPO, ChildProcess, Cluster, load_dev_cluster, wait_for

CHART = REPO / "charts" / "kube-ddp"
KUBE_DDP = Path(sys.executable).with_name("kube-ddp")
# The fake nodes' kubelet (kwok) never pulls: any image name does.
TEST_IMAGE = ("--set", "image.repository=registry.invalid/kube-ddp/operator")


@dataclass(frozen=True)
class Helm:
    """The dev cluster's helm, with its cache, config and data under `home` (nothing in ~)."""

    binary: Path
    kubeconfig: Path
    home: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
            "KUBECONFIG": str(self.kubeconfig),
        }
        result = subprocess.run(
            [str(self.binary), *args],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    def template(
        self, *args: str, namespace: str = "kube-ddp", release: str = "kube-ddp"
    ) -> list[dict[str, Any]]:
        out = self.run(
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version=1.36.0",
            *args,
        ).stdout
        return [d for d in yaml.safe_load_all(out) if d]


def helm_binary() -> Path:
    """The dev cluster's helm, built first on a cold cache (a background build of the tier
    has it ready by the tests that use it)."""
    return Path(load_dev_cluster().built("helm"))


def service_account_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as `namespace/account` with a TokenRequest token."""
    token = service_account_token(cluster, namespace, account)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dev",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority-data": base64.b64encode(
                        cluster.ca_file.read_bytes()
                    ).decode(),
                },
            }
        ],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Operator(ChildProcess):
    """`kube-ddp operator` with any arguments, its log in a file, its /readyz on a free port."""

    kubeconfig: Path
    args: tuple[str, ...]
    log_path: Path
    health_port: int = field(default_factory=lambda: load_dev_cluster().free_port())
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        command = [
            str(KUBE_DDP),
            "operator",
            f"--kubeconfig={self.kubeconfig}",
            f"--health-port={self.health_port}",
            "--metrics-port=0",
            "--trainer-image=registry.invalid/kube-ddp/trainer:test",
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return self

    def readyz(self) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, response.read().decode().strip()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode().strip()
        except OSError:
            return 0, "not listening"

    def wait_ready(self, prefix: str, timeout: float = 30) -> str:
        def ready() -> str | None:
            status, body = self.readyz()
            return body if status == 200 and body.startswith(prefix) else None

        return wait_for(ready, f"/readyz of {self.log_path.name} to say {prefix!r}", timeout)
