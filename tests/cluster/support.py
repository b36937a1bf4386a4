"""Helpers of the cluster tier: the running control plane, polling, and plain objects."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import kubernetes

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def load_dev_cluster() -> ModuleType:
    """hack/devcluster, the package behind hack/dev-cluster.py (hack/ is not a package)."""
    hack = str(REPO / "hack")
    if hack not in sys.path:
        sys.path.insert(0, hack)
    return importlib.import_module("devcluster")


@dataclass(frozen=True)
class Cluster:
    """The running control plane, as the `cluster` fixture yields it."""

    kubeconfig: Path  # admin (system:masters) kubeconfig, certificates embedded
    server: str  # https://127.0.0.1:<port>
    ca_file: Path  # CA that signed the apiserver's serving certificate
    bin_dir: Path  # kubectl and helm
    api: kubernetes.client.ApiClient  # admin client of the official sync `kubernetes` package

    @classmethod
    def of_dev_cluster(cls, state: dict[str, Any]) -> Cluster:
        """The dev cluster whose `up` returned `state`, with a client of its own to close."""
        dev_cluster = load_dev_cluster()
        kubeconfig = Path(state["kubeconfig"])
        api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        return cls(
            kubeconfig=kubeconfig,
            server=state["server"],
            ca_file=dev_cluster.PKI / "ca.crt",
            bin_dir=dev_cluster.STATE_DIR / "bin",
            api=api,
        )

    # Typed Any: the client's models make every field optional, and accept plain dicts as bodies.
    @property
    def core(self) -> Any:
        return kubernetes.client.CoreV1Api(self.api)

    @property
    def rbac(self) -> Any:
        return kubernetes.client.RbacAuthorizationV1Api(self.api)

    @property
    def custom_objects(self) -> Any:
        return kubernetes.client.CustomObjectsApi(self.api)

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    def client_with_token(self, token: str) -> kubernetes.client.ApiClient:
        """An API client that authenticates with a bearer token (a ServiceAccount's, say)."""
        configuration = kubernetes.client.Configuration()
        configuration.host = self.server
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {token}"}
        return kubernetes.client.ApiClient(configuration)


class ChildProcess:
    """A process a test started (subclasses are dataclasses with these two fields): SIGKILL,
    a clean stop, and its log."""

    process: subprocess.Popen[bytes] | None
    log_path: Path

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as when a node or the container dies."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def fresh_namespace(cluster: Cluster, name: str) -> Iterator[str]:
    """A new namespace whose `default` ServiceAccount exists (pods are refused before it),
    deleted afterwards (the namespace controller finishes that in the background)."""
    core = cluster.core
    core.create_namespace({"metadata": {"name": name, "labels": {"kubeddp.io/test": "true"}}})
    wait_for(
        lambda: (
            core.list_namespaced_service_account(name, field_selector="metadata.name=default").items
        ),
        f"ServiceAccount {name}/default",
        timeout=30,
    )
    try:
        yield name
    finally:
        core.delete_namespace(name)


def wait_for(
    check: Callable[[], T | None], what: str, timeout: float = 30, interval: float = 0.2
) -> T:
    """Poll `check` until it returns something truthy, and return that; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def pod_manifest(
    name: str,
    *,
    limits: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A one-container pod; kwok never runs the image, so it needs no registry."""
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/kube-ddp/none:0"}
    if limits:
        container["resources"] = {"limits": limits}
    metadata: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [container],
            "nodeSelector": node_selector or {},
            "terminationGracePeriodSeconds": 30,
        },
    }


IN_CI = os.environ.get("CI", "").lower() == "true"


# The API server's PodSecurity admission: the namespace label it enforces, and its refusals.
ENFORCE = "pod-security.kubernetes.io/enforce"
REFUSED = "violates PodSecurity"


def enforce(cluster: Cluster, namespace: str, level: str) -> None:
    """Label `namespace` to enforce `level`, and wait until admission acts on it (it reads
    namespaces from its informer's cache)."""
    cluster.core.patch_namespace(
        namespace, {"metadata": {"labels": {ENFORCE: level, f"{ENFORCE}-version": "latest"}}}
    )
    if level == "privileged":
        return
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {"hostPID": True, "containers": [{"name": "c", "image": "x"}]},
    }
    wait_for(lambda: server_refusal(cluster, namespace, probe), f"{level} enforced in {namespace}")


def server_refusal(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> str | None:
    """The server's PodSecurity refusal of `pod` as a dry run of what `kubectl create` sends,
    or None when it admits it."""
    done = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-",
        stdin=json.dumps(pod), check=False,
    )  # fmt: skip
    if done.returncode == 0:
        return None
    assert REFUSED in done.stderr, done.stderr
    return done.stderr.strip()
