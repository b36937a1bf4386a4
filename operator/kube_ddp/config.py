"""The operator's settings, in one place: from the command line to the controller (kopf's memo)."""

from __future__ import annotations

from dataclasses import dataclass

from kube_ddp import names


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    trainer_image: str = names.DEFAULT_TRAINER_IMAGE
    health_port: int = 8080  # /healthz (liveness)
    metrics_port: int = 8081  # /metrics (Prometheus); 0 turns it off
    json_logs: bool = False
    workers: int = 8  # jobs reconciled at once
    # Pods created but not yet seen in the watch count as Pending for at most this long.
    expectation_timeout: float = 30.0

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces
