"""The kopf wiring: which resources are watched and how their events reach the `Controller`.

Jobs and pods are observed with stateless event handlers and an index of our pods (kopf then
writes no annotation onto our objects and puts no finalizer on jobs); every event queues its
job for one reconcile in `kube_ddp.controller`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from kube_ddp import names
from kube_ddp.config import OperatorConfig
from kube_ddp.controller import Controller, Key
from kube_ddp.kube import Kube, load_credentials
from kube_ddp.status import PodView

# Pod events of one job within this many seconds are handled together: fewer status writes
# under load, at a small cost in reaction time.
POD_EVENT_WINDOW = 0.05
OUR_PODS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}


def _controller(memo: Any) -> Controller:
    controller: Controller = memo.controller
    return controller


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorConfig = memo.config
    # Only our pods are sent by the API server: a busy cluster's other pods cost nothing.
    selector = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
    settings.watching.label_selectors["pods"] = selector
    # kopf would list every CRD and namespace to follow new ones: a cluster-wide right we do
    # not need, since we watch fixed resources in fixed namespaces.
    settings.scanning.disabled = True
    memo.controller = Controller(config=config, kube=Kube())


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    controller = _controller(memo)
    await controller.queue.close()
    await controller.kube.close()


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """The same credentials as our own calls (kopf would prefer a client library's)."""
    return load_credentials()


@kopf.index("pods", labels=OUR_PODS)
def ddp_pods(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> Any:
    """Our pods by (namespace, job name), as the status core sees them."""
    job = labels.get(names.LABEL_JOB_NAME)
    return {(namespace, job): PodView.from_pod(body)} if job else None


@kopf.on.event(names.GROUP, names.VERSION, names.PLURAL)
async def job_event(
    type: str, event: kopf.RawEvent, name: str, namespace: str | None, memo: Any, **kwargs: Any
) -> None:
    controller = _controller(memo)
    controller.pods = kwargs["ddp_pods"]
    key: Key = (namespace or "default", name)
    if type == "DELETED":
        controller.job_deleted(key)
    else:
        controller.job_changed(key, dict(event["object"]))


@kopf.on.event("pods", labels=OUR_PODS)
async def pod_event(
    name: str, namespace: str | None, labels: Mapping[str, str], memo: Any, **kwargs: Any
) -> None:
    controller = _controller(memo)
    controller.pods = kwargs["ddp_pods"]
    job = labels.get(names.LABEL_JOB_NAME)
    if job and namespace:
        controller.pod_changed((namespace, job), name, POD_EVENT_WINDOW)
