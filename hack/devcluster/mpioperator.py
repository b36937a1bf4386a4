"""The Kubeflow MPI Operator (`launcher: mpi` jobs run through it), run against this clone's
control plane as a plain process: its CRD applied server-side from the module it was built from,
its leader Lease cleared first, stopped (and the Lease cleared again) on the way out.

It serves its health checks on :8080 of every interface, hard-coded, so only one can run per
machine: `running()` holds a machine-wide lock while it runs (a second caller waits).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from devcluster.build import MPI_OPERATOR_VERSION, MPIJOB_CRD_FILE, built
from devcluster.controlplane import apply_crds, kubectl
from devcluster.paths import KUBECONFIG, LOGS, ClusterError, log, machine_lock
from devcluster.processes import Component, http_get, spawn, stop_component, wait_until

NAME = "mpi-operator"
LOCK_NAMESPACE = "mpi-operator"  # its leader Lease lives here; the namespace must exist
HEALTH_URL = "http://127.0.0.1:8080/healthz"
CRD_NAME = "mpijobs.kubeflow.org"
LEADING = b"Started workers"  # its controller, once it leads and its caches are filled
LOCK_WAIT = 600.0  # seconds: another clone's test session may hold it that long
LOG = LOGS / f"{NAME}.log"


def crd_file() -> Path:
    """The MPIJob CRD, copied next to the binary from the module that built it."""
    return built(NAME).parent / Path(MPIJOB_CRD_FILE).name


def install_crd(kubeconfig: Path = KUBECONFIG) -> None:
    """Apply the MPIJob CRD."""
    apply_crds([crd_file()], [CRD_NAME], kubeconfig)


def crd_installed(kubeconfig: Path = KUBECONFIG) -> bool:
    return bool(kubectl("get", f"crd/{CRD_NAME}", "--ignore-not-found", kubeconfig=kubeconfig))


def remove_crd(kubeconfig: Path = KUBECONFIG) -> None:
    """Delete the MPIJob CRD (and so every MPIJob): the cluster no longer serves the kind."""
    kubectl("delete", f"crd/{CRD_NAME}", "--ignore-not-found", "--wait=true", kubeconfig=kubeconfig)


def _clear_lease(kubeconfig: Path) -> None:
    # It does not release its Lease when it stops: the next one would wait ~17 s for it.
    kubectl(
        "--namespace",
        LOCK_NAMESPACE,
        "delete",
        "lease",
        NAME,
        "--ignore-not-found",
        "--wait=false",
        kubeconfig=kubeconfig,
    )


@contextlib.contextmanager
def running(
    kubeconfig: Path = KUBECONFIG, namespace: str | None = None, extra_args: Sequence[str] = ()
) -> Iterator[Component]:
    """The MPI Operator, leading, watching `namespace` (all when None), until the block ends;
    `extra_args` are added to its command line."""
    operator = built(NAME)
    install_crd(kubeconfig)
    with machine_lock(
        NAME,
        LOCK_WAIT,
        "another MPI Operator runs (its health port 8080 is fixed: one per machine)",
    ):
        if http_get(HEALTH_URL)[0] != 0:
            raise ClusterError(
                "something already serves 127.0.0.1:8080, the MPI Operator's fixed health port"
            )
        existing = kubectl("get", "namespace", LOCK_NAMESPACE, kubeconfig=kubeconfig, check=False)
        if not existing:
            kubectl("create", "namespace", LOCK_NAMESPACE, kubeconfig=kubeconfig)
        _clear_lease(kubeconfig)
        argv = [
            str(operator),
            f"--kubeConfig={kubeconfig}",
            f"--lock-namespace={LOCK_NAMESPACE}",
            *([f"--namespace={namespace}"] if namespace else []),
            # Its defaults (5 requests/s, bursts of 10) make a test wait for its own client.
            "--kube-api-qps=50",
            "--kube-api-burst=100",
            "--threadiness=4",
            "-v=2",
            *extra_args,
        ]
        LOGS.mkdir(parents=True, exist_ok=True)
        # KUBECONFIG in its environment would override --kubeConfig.
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}

        start = LOG.stat().st_size if LOG.exists() else 0
        process = spawn(NAME, argv, env=env)
        component = Component(name=NAME, pid=process.pid, argv=argv)

        def leading() -> bool:
            with open(LOG, "rb") as said:
                said.seek(start)
                return LEADING in said.read()

        try:
            wait_until(
                f"the MPI Operator {MPI_OPERATOR_VERSION} to lead", leading, 60, {NAME: process}
            )
            log(f"MPI Operator {MPI_OPERATOR_VERSION} running (pid {process.pid})")
            yield component
        finally:
            stop_component(component, grace=10)
            _clear_lease(kubeconfig)
