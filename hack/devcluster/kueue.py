"""Kueue (sigs.k8s.io/kueue, built by `build.ADDONS`) as a process next to the control plane,
for the tests of kube-ddp's Kueue contract: `running(state)` installs it and takes it all away
again.

Out of cluster, as the reference note measured (docs/dev-cluster.md, "Kueue"):
- its CRDs from the same module version, applied server-side (the Workload CRD is 1.4 MB);
- its webhooks served on 127.0.0.1 with a certificate of the cluster's CA, registered by URL,
  only the hooks of Kueue's own kinds: a pod or Job hook with `failurePolicy: Fail` would break
  every pod or Job once Kueue stops; the configurations are deleted when it stops;
- internal certificate management off (it certifies a Service name the API server cannot
  reach here); v0.19.2 then reads a metrics certificate from the hard-coded
  /etc/kueue/metrics/certs, which it gets from an overlay on /etc in a private mount namespace
  (the host's /etc is untouched);
- `externalFrameworks` names the DDPTrainingJob kind: Kueue treats it as a known owner and
  leaves its Workloads to kube-ddp's operator; its own MPIJob integration runs too (set up
  when the MPIJob kind is served), and takes kube-ddp's MPIJobs for children of a queued job.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devcluster import webhooks
from devcluster.build import KUEUE_CRDS, built
from devcluster.controlplane import State, apply_crds, free_port, kubectl
from devcluster.paths import LOGS, RUN, ClusterError, log
from devcluster.processes import Component, is_healthy, spawn_to, stop_component, wait_until

NAMESPACE = "kueue-system"
LOG = LOGS / "kueue.log"
EXTERNAL_FRAMEWORK = "DDPTrainingJob.v1alpha1.kubeddp.io"
# Kueue's own kinds: the only webhooks registered (paths of config/components/webhook).
OWN_HOOKS = "kueue-x-k8s-io"
WEBHOOK_CONFIGS = {
    "MutatingWebhookConfiguration": "kube-ddp-dev-kueue-mutating",
    "ValidatingWebhookConfiguration": "kube-ddp-dev-kueue-validating",
}


def config(ports: dict[str, int], cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {
            # One is required; their hooks stay unregistered. Kueue's MPIJob integration runs
            # so that the tests see it leave kube-ddp's MPIJobs (children of a queued job) to
            # the job's Workload.
            "frameworks": ["batch/job", "kubeflow.org/mpijob"],
            "externalFrameworks": [EXTERNAL_FRAMEWORK],
        },
    }


def _apply_crds(bin_dir: Path) -> None:
    files = [bin_dir / f"kueue.x-k8s.io_{crd}.yaml" for crd in KUEUE_CRDS]
    apply_crds(files, [f"{crd}.kueue.x-k8s.io" for crd in KUEUE_CRDS])


def _remove(bin_dir: Path) -> None:
    """Everything `running` added, in the order that leaves no hook without its server."""
    webhooks.unregister(WEBHOOK_CONFIGS)
    _release_objects()
    files = [bin_dir / f"kueue.x-k8s.io_{crd}.yaml" for crd in KUEUE_CRDS]
    kubectl("delete", "--ignore-not-found", "--wait=false", *(f"--filename={f}" for f in files))
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false")
    _wait_gone([f"crd/{crd}.kueue.x-k8s.io" for crd in KUEUE_CRDS] + [f"namespace/{NAMESPACE}"])


def _release_objects() -> None:
    """Kueue's finalizers on its objects outlive a stopped Kueue, which alone removes them:
    left, they would hold its CRDs Terminating, and the next start could not create them."""
    for crd in KUEUE_CRDS:
        resource = f"{crd}.kueue.x-k8s.io"
        listed = kubectl("get", resource, "--all-namespaces", "--output=json", check=False)
        for item in json.loads(listed or '{"items": []}')["items"]:
            meta = item["metadata"]
            if meta.get("finalizers"):
                where = [f"--namespace={meta['namespace']}"] if "namespace" in meta else []
                unfinalized = '{"metadata": {"finalizers": null}}'
                kubectl("patch", resource, meta["name"], *where, "--type=merge", "-p", unfinalized)


def _terminating_crds() -> list[str]:
    names = [f"{crd}.kueue.x-k8s.io" for crd in KUEUE_CRDS]
    listed = kubectl("get", "crd", *names, "--ignore-not-found", "--output=json", check=False)
    items = json.loads(listed or '{"items": []}')["items"]  # several names: always a List
    return [f"crd/{i['metadata']['name']}" for i in items if i["metadata"].get("deletionTimestamp")]


def _wait_gone(objects: list[str]) -> None:
    kubectl("wait", "--for=delete", "--timeout=60s", *objects, check=False)


@contextlib.contextmanager
def running(state: State) -> Iterator[Component]:
    """Kueue installed and running against the cluster of `state`; removed afterwards."""
    if os.geteuid() != 0:
        raise ClusterError("Kueue out of cluster needs root (a mount namespace for its certs)")
    kueue = built("kueue")
    bin_dir = kueue.parent
    work = RUN / "kueue"
    shutil.rmtree(work, ignore_errors=True)
    certs = work / "certs"
    upper = work / "etc-upper"
    (upper / "kueue" / "metrics" / "certs").mkdir(parents=True)
    (work / "etc-work").mkdir()
    certs.mkdir()
    ca_bundle = webhooks.serving_certificate(
        "kueue-webhook", certs, upper / "kueue" / "metrics" / "certs"
    )
    ports = {name: free_port() for name in ("health", "metrics", "webhook")}
    (work / "config.json").write_text(json.dumps(config(ports, certs), indent=2))
    hooks = webhooks.by_url(
        bin_dir / "manifests.yaml",
        ports["webhook"],
        ca_bundle,
        WEBHOOK_CONFIGS,
        keep=lambda hook: OWN_HOOKS in hook["clientConfig"]["service"]["path"],
    )
    overlay = f"lowerdir=/etc,upperdir={upper},workdir={work / 'etc-work'}"
    script = f'mount -t overlay overlay -o "{overlay}" /etc && exec "$0" "$@"'  # $0: kueue
    command = [
        str(kueue),
        f"--config={work / 'config.json'}",
        f"--kubeconfig={state['kubeconfig']}",
        "--feature-gates=VisibilityOnDemand=false",  # its API service needs in-cluster serving
    ]
    # unshare and sh exec into kueue: the process keeps its pid and then runs `command`.
    argv = ["unshare", "--mount", "--propagation=private", "sh", "-c", script, *command]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    kubectl("apply", "-f", "-", stdin=json.dumps(namespace))
    component: Component | None = None
    try:
        if terminating := _terminating_crds():  # a Kueue stopped without this cleanup
            _release_objects()
            _wait_gone(terminating)
        _apply_crds(bin_dir)
        process = spawn_to(LOG, argv)
        component = {"name": "kueue", "pid": process.pid, "argv": command}
        check = functools.partial(is_healthy, f"http://127.0.0.1:{ports['health']}/readyz")
        wait_until("kueue /readyz", check, 90, {"kueue": process})
        webhooks.register(hooks)
        log(f"kueue ready, webhooks on 127.0.0.1:{ports['webhook']}")
        yield component
    finally:
        if component is not None:
            stop_component(component)
        _remove(bin_dir)
