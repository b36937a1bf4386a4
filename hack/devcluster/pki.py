"""The cluster's certificates (openssl, EC P-256) and self-contained kubeconfig files."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

from devcluster.paths import PKI, ClusterError


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


def write_kubeconfig(path: Path, server: str, user: str) -> None:
    """A self-contained kubeconfig: certificates are embedded, so the file can be copied."""

    def data(name: str) -> str:
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
