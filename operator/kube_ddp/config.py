"""The operator's settings, in one place: from the command line to the controller (kopf's memo)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kube_ddp import names
from kube_ddp.operator_policy import PodPolicy

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    trainer_image: str = names.DEFAULT_TRAINER_IMAGE
    network_policy: bool = True  # each job's NetworkPolicy unless its spec turns it off
    health_port: int = 8080  # /healthz (liveness) and /readyz (readiness)
    metrics_port: int = 8081  # /metrics (Prometheus); 0 turns it off
    log_format: str = "full"  # json, plain or full (kopf's formats)
    workers: int = 8  # jobs reconciled at once
    # Pods created but not yet seen in the watch count as Pending for at most this long.
    expectation_timeout: float = 30.0
    pod_policy: PodPolicy = field(default_factory=PodPolicy)  # a floor under every job's pods

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces


def default_identity() -> str:
    """Unique per process: the pod's name (the hostname in a pod) and a random suffix, so a
    restarted container never mistakes its predecessor's Lease for its own."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """$POD_NAMESPACE (the chart sets it), else the in-cluster namespace, else default."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True)
class LeaseSettings:
    name: str = "kube-ddp"
    namespace: str = field(default_factory=default_namespace)
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0  # a candidate waits this long for a silent leader
    renew_deadline: float = 10.0  # a leader that could not renew for this long stops
    retry_period: float = 2.0  # between tries (candidates) and renewals (the leader)

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period} < {self.renew_deadline} < {self.lease_duration}"
            )
