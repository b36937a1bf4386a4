"""Kubeflow Trainer v2 (TrainJob) and the JobSet controller its TrainJobs run on, against a dev
cluster, out of the cluster: the Kubeflow peer new users install today, which `make bench`
compares kube-ddp with (benchmarks/contenders.py).

Both are built from their pinned Go modules (`jobset` and `kubeflow-trainer` in build.ADDONS)
and run with their own defaults (client 50 requests/s, bursts of 100, and 5 TrainJobs
reconciled at once for the Trainer; 500 and 500 for JobSet), out of the cluster:

- their CRDs from the same modules, applied server-side, and the module's `torch-distributed`
  ClusterTrainingRuntime, the one its docs start from;
- every webhook of theirs (JobSet's pod hooks with the object selector its deployment adds)
  served on 127.0.0.1 with a certificate of the cluster's CA and registered by URL, deleted
  again when they stop: left, a hook with `failurePolicy: Fail` would refuse every TrainJob and
  JobSet, and every JobSet's pods;
- their own certificate management off (it certifies a Service name the API server cannot reach
  here), leader election off; the Trainer reads its serving certificate from
  `$TMPDIR/k8s-webhook-server/serving-certs` (no setting names another directory).

They watch every namespace (neither has a setting to watch one).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster import webhooks
from devcluster.build import JOBSET_CRD_FILE, TRAINER_CRDS, TRAINER_RUNTIME_FILE, built
from devcluster.controlplane import apply_crds, free_port, kubectl
from devcluster.peers import stop
from devcluster.processes import is_healthy, spawn_to, wait_until

JOBSET = "jobset"
TRAINER = "kubeflow-trainer"
JOBSET_CRD = "jobsets.jobset.x-k8s.io"
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime of TRAINER_RUNTIME_FILE
JOBSET_WEBHOOKS = {
    "MutatingWebhookConfiguration": "kube-ddp-dev-jobset-mutating",
    "ValidatingWebhookConfiguration": "kube-ddp-dev-jobset-validating",
}
TRAINER_WEBHOOKS = {
    "MutatingWebhookConfiguration": "kube-ddp-dev-trainer-mutating",
    "ValidatingWebhookConfiguration": "kube-ddp-dev-trainer-validating",
}
# JobSet's deployment (config/components/webhook/patches) limits its pod hooks to JobSet's pods.
JOBSET_PODS = {
    "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
}


@dataclass(frozen=True)
class Running:
    jobset: subprocess.Popen[bytes]
    trainer: subprocess.Popen[bytes]
    trainer_metrics: int  # the Trainer's controller-runtime /metrics port, plain HTTP

    @property
    def pids(self) -> tuple[int, int]:
        return self.trainer.pid, self.jobset.pid


def _jobset_hooks(port: int, ca_bundle: str, kubeconfig: Path) -> list[dict[str, Any]]:
    configurations = webhooks.by_url(
        built(JOBSET).parent / "manifests.yaml", port, ca_bundle, JOBSET_WEBHOOKS,
        kubeconfig=kubeconfig,
    )  # fmt: skip
    for configuration in configurations:
        for hook in configuration["webhooks"]:
            if any("pods" in rule["resources"] for rule in hook["rules"]):
                hook["objectSelector"] = JOBSET_PODS
    return configurations


def _start(
    name: str, argv: list[str], env: dict[str, str], health: int, scratch: Path
) -> subprocess.Popen[bytes]:
    process = spawn_to(scratch / f"{name}.log", argv, env)
    ready = functools.partial(is_healthy, f"http://127.0.0.1:{health}/readyz")
    try:
        wait_until(f"{name} /readyz", ready, 90, {name: process}, scratch)
    except BaseException:
        stop(process)
        raise
    return process


@contextlib.contextmanager
def running(kubeconfig: Path, scratch: Path) -> Iterator[Running]:
    """JobSet and the Trainer running against the cluster of `kubeconfig`, their webhooks
    registered, the torch runtime installed, until the block ends; logs in `scratch`."""
    jobset_bin, trainer_bin = built(JOBSET).parent, built("trainer-controller-manager").parent
    apply_crds([jobset_bin / Path(JOBSET_CRD_FILE).name], [JOBSET_CRD], kubeconfig)
    apply_crds(
        [trainer_bin / f"trainer.kubeflow.org_{crd}.yaml" for crd in TRAINER_CRDS],
        [f"{crd}.trainer.kubeflow.org" for crd in TRAINER_CRDS],
        kubeconfig,
    )
    jobset_certs = scratch / "jobset-certs"
    trainer_tmp = scratch / "trainer-tmp"
    ca_bundle = webhooks.serving_certificate(
        "kubeflow-webhook", jobset_certs, trainer_tmp / "k8s-webhook-server" / "serving-certs"
    )
    ports = {name: free_port() for name in ("js-health", "js-hook", "health", "metrics", "hook")}
    jobset_config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": ports["js-hook"], "host": "127.0.0.1", "certDir": str(jobset_certs)},
        "metrics": {"bindAddress": "0"},  # off: the benchmark reads the Trainer's
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['js-health']}"},
    }
    trainer_config = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "webhook": {"port": ports["hook"], "host": "127.0.0.1"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}", "secureServing": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "statusServer": {"port": free_port()},
    }
    for name, config in ((JOBSET, jobset_config), (TRAINER, trainer_config)):
        (scratch / f"{name}-config.json").write_text(json.dumps(config, indent=2))
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["KUBECONFIG"] = str(kubeconfig)
    started: list[subprocess.Popen[bytes]] = []
    try:
        argv = [str(jobset_bin / JOBSET), f"--config={scratch / 'jobset-config.json'}"]
        started.append(_start(JOBSET, argv, env, ports["js-health"], scratch))
        webhooks.register(_jobset_hooks(ports["js-hook"], ca_bundle, kubeconfig), kubeconfig)
        argv = [
            str(trainer_bin / "trainer-controller-manager"),
            f"--config={scratch / f'{TRAINER}-config.json'}",
        ]
        started.append(
            _start(TRAINER, argv, {**env, "TMPDIR": str(trainer_tmp)}, ports["health"], scratch)
        )
        trainer_hooks = webhooks.by_url(
            trainer_bin / "manifests.yaml", ports["hook"], ca_bundle, TRAINER_WEBHOOKS,
            kubeconfig=kubeconfig,
        )  # fmt: skip
        webhooks.register(trainer_hooks, kubeconfig)
        runtime = trainer_bin / Path(TRAINER_RUNTIME_FILE).name
        kubectl("apply", "--server-side", f"--filename={runtime}", kubeconfig=kubeconfig)
        yield Running(jobset=started[0], trainer=started[1], trainer_metrics=ports["metrics"])
    finally:
        webhooks.unregister(TRAINER_WEBHOOKS, kubeconfig)
        webhooks.unregister(JOBSET_WEBHOOKS, kubeconfig)
        for process in reversed(started):
            stop(process)
