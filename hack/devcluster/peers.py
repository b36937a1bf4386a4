"""Kubeflow's Training Operator v1 (PyTorchJob) against a dev cluster, out of the cluster: a peer
that `make bench` compares kube-ddp with (benchmarks/operator_bench.py).

It is built from its pinned Go module (`training-operator` in devcluster.build); its CRD is read
from that module and applied server-side. What it needs and cannot be told by a flag:

- a cert-controller rotator, always on, that Gets and fills the Secret
  `training-operator-webhook-cert` in `$MY_POD_NAMESPACE` (which must exist) and waits for
  `tls.crt` in the hard-coded /tmp/k8s-webhook-server/serving-certs before any controller starts.
  It runs in a private mount namespace with its own tmpfs on /tmp holding a self-signed cert and
  a copy of the kubeconfig, so the host's /tmp is never touched and two runs never share it.
  No webhook configuration is registered: the API server never calls its webhook (the rotator
  logs "Webhook not found" and goes on).
- its webhook server binds every interface: on a free port.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from devcluster.build import PYTORCHJOB_CRD_FILE, built
from devcluster.controlplane import apply_crds, free_port, kubectl
from devcluster.pki import new_key, openssl
from devcluster.processes import is_healthy, wait_until

TRAINING_OPERATOR = "training-operator"
PYTORCHJOB_CRD = "pytorchjobs.kubeflow.org"
# The rotator's Secret: the name is its flag's default, the namespace its fallback's name.
OPERATOR_NAMESPACE = "kubeflow"
WEBHOOK_SECRET = "training-operator-webhook-cert"
CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # hard-coded in its pkg/cert
# Started in a new mount namespace: /tmp is a fresh tmpfs there, holding only the cert and the
# kubeconfig ($0 is the cert directory, $1 the kubeconfig, $2 the binary). All three are opened
# before the tmpfs hides them: a clone, the binary cache or pytest's scratch directory may well
# live under /tmp. The binary is run through its open descriptor (/proc/self/fd/3).
PRIVATE_KUBECONFIG = "/tmp/kubeconfig"
IN_PRIVATE_TMP = (
    'crt=$(cat "$0"/tls.crt) && key=$(cat "$0"/tls.key) && config=$(cat "$1") && shift && '
    'exec 3<"$1" && shift && '
    'mount -t tmpfs tmpfs /tmp && mkdir -p "$CERT_DIR" && '
    'printf "%s\\n" "$crt" > "$CERT_DIR"/tls.crt && printf "%s\\n" "$key" > "$CERT_DIR"/tls.key && '
    f'printf "%s\\n" "$config" > {PRIVATE_KUBECONFIG} && exec /proc/self/fd/3 "$@"'
)


def pytorchjob_crd_file() -> Path:
    return built(TRAINING_OPERATOR).parent / Path(PYTORCHJOB_CRD_FILE).name


def self_signed_cert(directory: Path) -> None:
    """tls.crt and tls.key for 127.0.0.1 in `directory`: the webhook server only needs one."""
    directory.mkdir(parents=True, exist_ok=True)
    new_key(directory / "tls.key")
    # fmt: off
    openssl(
        "req", "-x509", "-new", "-key", str(directory / "tls.key"), "-subj", "/CN=127.0.0.1",
        "-days", "1", "-addext", "subjectAltName=IP:127.0.0.1", "-out", str(directory / "tls.crt"),
    )
    # fmt: on


def prepare_training_operator(kubeconfig: Path, scratch: Path) -> None:
    """Its CRD, and the namespace and (empty) Secret its cert rotator insists on."""
    apply_crds([pytorchjob_crd_file()], [PYTORCHJOB_CRD], kubeconfig)
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": WEBHOOK_SECRET, "namespace": OPERATOR_NAMESPACE},
        },
    ]
    manifest = scratch / "training-operator-objects.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    kubectl("apply", "--server-side", f"--filename={manifest}", kubeconfig=kubeconfig)


@contextlib.contextmanager
def training_operator(
    kubeconfig: Path, namespace: str, scratch: Path, extra_args: Sequence[str] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run the Training Operator (PyTorchJob only) on the jobs of `namespace` until the block
    ends; yields the process and its metrics port (controller-runtime's /metrics, plain HTTP).
    Its log is scratch/training-operator.log."""
    prepare_training_operator(kubeconfig, scratch)
    certs = scratch / "training-operator-certs"
    self_signed_cert(certs)
    health, metrics = free_port(), free_port()
    argv = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c", IN_PRIVATE_TMP, str(certs),
        str(kubeconfig),
        str(built(TRAINING_OPERATOR)),
        f"--kubeconfig={PRIVATE_KUBECONFIG}",
        "--enable-scheme=pytorchjob",
        f"--namespace={namespace}",
        f"--webhook-server-port={free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{health}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        *extra_args,
    ]  # fmt: skip
    log_path = scratch / f"{TRAINING_OPERATOR}.log"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(CERT_DIR=CERT_DIR, MY_POD_NAMESPACE=OPERATOR_NAMESPACE)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env
        )
    try:
        ready = functools.partial(is_healthy, f"http://127.0.0.1:{health}/readyz")
        wait_until(
            "the Training Operator's /readyz", ready, 90, {TRAINING_OPERATOR: process}, scratch
        )
        yield process, metrics
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], grace: float = 20) -> None:
    """SIGTERM to a process this one started, then SIGKILL after `grace` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
