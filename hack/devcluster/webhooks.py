"""Admission webhooks of a controller run out of the cluster (Kueue, JobSet, Kubeflow Trainer):
a serving certificate of the cluster's CA for 127.0.0.1, and the module's own webhook
configurations, renamed, each kept hook called by URL on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from devcluster.controlplane import kubectl
from devcluster.paths import KUBECONFIG, PKI
from devcluster.pki import new_certificate

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def serving_certificate(name: str, *directories: Path) -> str:
    """tls.crt and tls.key for 127.0.0.1, signed by the cluster's CA, in each of `directories`;
    returns the CA bundle (base64) a webhook configuration names."""
    new_certificate(
        PKI, name, f"/CN={name}", ["extendedKeyUsage=serverAuth", "subjectAltName=IP:127.0.0.1"]
    )
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy(PKI / f"{name}.crt", directory / "tls.crt")
        shutil.copy(PKI / f"{name}.key", directory / "tls.key")
    return base64.b64encode((PKI / "ca.crt").read_bytes()).decode()


def read_objects(manifests: Path, kubeconfig: Path = KUBECONFIG) -> list[dict[str, Any]]:
    """The objects of a YAML file, read by kubectl (the dev cluster's code has no YAML parser):
    it prints one JSON document per object."""
    argv = ("create", "--dry-run=client", "-o", "json", f"--filename={manifests}")
    text = kubectl(*argv, kubeconfig=kubeconfig)
    decoder, objects, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        obj, end = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        objects.append(obj)
        at = end
    return objects


def by_url(
    manifests: Path,
    port: int,
    ca_bundle: str,
    names: dict[str, str],
    keep: Callable[[dict[str, Any]], bool] = lambda hook: True,
    kubeconfig: Path = KUBECONFIG,
) -> list[dict[str, Any]]:
    """The webhook configurations of `manifests`, each renamed by `names` (kind -> name), with
    the hooks `keep` accepts, each called at https://127.0.0.1:`port` on its own path."""
    result = []
    for obj in read_objects(manifests, kubeconfig):
        if obj.get("kind") not in names:
            continue
        hooks = []
        for hook in obj["webhooks"]:
            if keep(hook):
                url = f"https://127.0.0.1:{port}{hook['clientConfig']['service']['path']}"
                hooks.append({**hook, "clientConfig": {"url": url, "caBundle": ca_bundle}})
        obj["metadata"] = {"name": names[obj["kind"]]}
        obj["webhooks"] = hooks
        result.append(obj)
    return result


def register(configurations: Iterable[dict[str, Any]], kubeconfig: Path = KUBECONFIG) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": list(configurations)}
    kubectl("apply", "-f", "-", stdin=json.dumps(listed), kubeconfig=kubeconfig)


def unregister(names: dict[str, str], kubeconfig: Path = KUBECONFIG) -> None:
    for kind, name in names.items():
        kubectl("delete", kind.lower(), name, "--ignore-not-found", kubeconfig=kubeconfig)
