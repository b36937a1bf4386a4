"""The operator process: health probes, leader election, then kopf.

    probes up -> (campaign for the Lease) -> kopf runs -> (renew the Lease) -> ... -> stop

- `/healthz` (liveness) answers 200 while the process's event loop runs, leader or not.
- `/readyz` (readiness) answers 200 for the leader only once kopf's startup handlers have run
  and its watches of jobs and pods are started ("watching"); for a standby, once it has read
  the Lease and sees a live leader ("ready to take over"). A standby counts as ready because
  Deployments roll out and `helm install --wait` waits on readiness: a standby that is never
  Ready would stall every rolling update behind the leader it is meant to replace. The body
  says which it is, and the `kubeddp_leader` gauge is 1 on the leader only.
- Losing the Lease ends the process at once (exit 3), as client-go's controllers do: nothing
  may act after its renew deadline, and the kubelet restarts the container as a candidate. A
  clean stop (SIGTERM) releases the Lease, so a standby takes over on its next try.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import kopf
from aiohttp import web

from kube_ddp import metrics
from kube_ddp.config import LeaseSettings, OperatorConfig
from kube_ddp.kopf_insights import Insights
from kube_ddp.kube import Kube
from kube_ddp.leadership import LeaseElector

log = logging.getLogger(__name__)
EXIT_LOST_LEADERSHIP = 3


class Probes:
    """What /healthz and /readyz report, from the state of the process."""

    def __init__(self, elector: LeaseElector | None) -> None:
        self.elector = elector
        self.kopf_started = asyncio.Event()  # kopf's ready_flag: startup handlers done
        self.insights = Insights()  # kopf's: ready_resources once its watches are spawned
        self.acting = False

    def readiness(self) -> tuple[bool, str]:
        if self.acting:
            if self.kopf_started.is_set() and self.insights.ready_resources.is_set():
                return True, "leader: watching" if self.elector else "watching"
            return False, "starting: kopf's watches are not up yet"
        if self.elector is not None and self.elector.holder:
            return True, f"standby: {self.elector.holder} leads"
        return False, "standby: the Lease has not been read yet"

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.Request) -> web.Response:
        ready, why = self.readiness()
        return web.Response(status=200 if ready else 503, text=why + "\n")

    async def serve(self, port: int) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", port).start()  # a pod's probes
        return runner


async def _wait_for_leadership(elector: LeaseElector) -> bool:
    """Campaign until leader (True) or until SIGTERM/SIGINT (False)."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    campaign = asyncio.create_task(elector.acquire(), name="leader election")
    stop = asyncio.create_task(stopped.wait(), name="stop signal")
    try:
        await asyncio.wait({campaign, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)  # kopf installs its own
        for task in (campaign, stop):
            task.cancel()
    return campaign.done() and not campaign.cancelled() and campaign.exception() is None


def _job_bodies(memo: kopf.Memo) -> Callable[[], list[dict[str, Any]]]:
    """What /metrics counts: the controller's jobs, none on a standby."""

    def bodies() -> list[dict[str, Any]]:
        controller = getattr(memo, "controller", None)
        return controller.jobs.bodies() if controller is not None else []

    return bodies


async def run(config: OperatorConfig, lease: LeaseSettings | None, memo: kopf.Memo) -> int:
    """Run the operator until it is stopped (0) or loses its Lease (the process exits 3)."""
    kube = Kube() if lease is not None else None
    elector = LeaseElector(kube, lease) if kube is not None and lease is not None else None
    probes = Probes(elector)
    runner = await probes.serve(config.health_port) if config.health_port else None
    metrics.LEADER.set(0)
    metrics.serve(config.metrics_port, _job_bodies(memo))  # standbys are scraped too
    try:
        if elector is not None:
            settings = elector.settings
            log.info(
                "campaigning for Lease %s/%s as %s",
                settings.namespace,
                settings.name,
                settings.identity,
            )
            if not await _wait_for_leadership(elector):
                return 0
        probes.acting = True
        metrics.LEADER.set(1)
        memo.insights = probes.insights  # what kopf watches: handlers.configure reads it
        operator = asyncio.create_task(
            kopf.operator(
                standalone=True,  # no kopf peering: the Lease decides who acts
                clusterwide=config.clusterwide,
                namespaces=config.namespaces,
                ready_flag=probes.kopf_started,
                insights=probes.insights,
                memo=memo,
            ),
            name="kopf",
        )
        tasks: set[asyncio.Task[Any]] = {operator}
        if elector is not None:
            tasks.add(asyncio.create_task(elector.hold(), name="lease renewal"))
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if operator not in done:
            # Leadership lost: stop acting now, not after a graceful shutdown.
            log.critical("leadership lost: exiting so that only the new leader acts")
            logging.shutdown()
            os._exit(EXIT_LOST_LEADERSHIP)
        for task in tasks - done:
            task.cancel()
        operator.result()
        return 0
    finally:
        metrics.LEADER.set(0)
        if elector is not None:
            await elector.release()
        if kube is not None:
            await kube.close()
        if runner is not None:
            await runner.cleanup()
