"""Leader election with a coordination.k8s.io/v1 Lease: one operator acts, the others wait.

The algorithm is the one of client-go's leaderelection package, which every controller
manager runs:

- A candidate reads the Lease. It may take it when nobody holds it, when it holds it itself,
  or when the holder's record has not changed for `leaseDurationSeconds` *as measured by the
  candidate's own clock* since the candidate first saw that record (clocks of different
  machines are never compared). It takes it with an update that carries the resourceVersion it
  read, so of two candidates only one succeeds (the other gets 409 Conflict).
- The leader renews every `retry_period`. If it has not renewed for `renew_deadline`
  (< lease duration), it gives up leadership and must stop acting at once: the operator exits
  and Kubernetes restarts it as a candidate. As the deadline is shorter than the duration, the
  old leader has stopped before any candidate may take over.
- On a clean shutdown the leader releases the Lease (empty holder), so a standby takes over on
  its next try instead of waiting out the duration.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp

from kube_ddp import names
from kube_ddp.api import Obj
from kube_ddp.config import LeaseSettings
from kube_ddp.kube import ApiError, ConflictError, Kube, NotFoundError

log = logging.getLogger(__name__)
LEASE_API = "/apis/coordination.k8s.io/v1"
# Failed tries: the API server said no, or could not be reached in time.
TRANSIENT = (ApiError, aiohttp.ClientError, OSError, TimeoutError)


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claim(spec: Obj, identity: str, duration: float, now: datetime) -> Obj:
    """The Lease spec after `identity` takes or renews it (pure)."""
    taking_over = spec.get("holderIdentity") != identity
    stamp = micro_time(now)
    return {
        **spec,
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, round(duration)),
        "renewTime": stamp,
        "acquireTime": stamp if taking_over else spec.get("acquireTime", stamp),
        "leaseTransitions": int(spec.get("leaseTransitions") or 0)
        + (1 if taking_over and spec else 0),  # as client-go: a released Lease counts too
    }


def release(spec: Obj, identity: str, now: datetime) -> Obj | None:
    """The Lease spec after `identity` lets go of it, or None if it does not hold it (pure)."""
    if spec.get("holderIdentity") != identity:
        return None
    return {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(now)}


def record_of(spec: Obj) -> tuple[Any, ...]:
    """What must change for a candidate to see its holder alive."""
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))


class LeaseElector:
    """Campaigns for, holds and releases one Lease through the operator's Kube client."""

    def __init__(
        self,
        kube: Kube,
        settings: LeaseSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self._clock = clock
        self._record: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # local clock when the record last changed
        self._renewed_at: float | None = None  # local clock of our last successful write
        self.holder: str | None = None  # the holder we last saw
        self.leader = False

    @property
    def path(self) -> str:
        return f"{self.collection}/{names.path_segment(self.settings.name)}"

    @property
    def collection(self) -> str:
        return f"{LEASE_API}/namespaces/{names.path_segment(self.settings.namespace)}/leases"

    def _observe(self, spec: Obj) -> None:
        record = record_of(spec)
        if record != self._record:
            self._record = record
            self._observed_at = self._clock()
        self.holder = spec.get("holderIdentity") or None

    def _held_by_another(self, spec: Obj) -> bool:
        holder = spec.get("holderIdentity")
        if not holder or holder == self.settings.identity:
            return False
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration)
        return self._clock() < self._observed_at + duration

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the Lease afterwards."""
        now = datetime.now(UTC)
        me = self.settings.identity
        try:
            lease = await self.kube.request("GET", self.path)
        except NotFoundError:
            return await self._create(claim({}, me, self.settings.lease_duration, now))
        spec = dict(lease.get("spec") or {})
        self._observe(spec)
        if self._held_by_another(spec):
            self.leader = False
            return False
        lease["spec"] = claim(spec, me, self.settings.lease_duration, now)
        try:
            updated = await self.kube.request("PUT", self.path, lease)  # resourceVersion inside
        except ConflictError:  # another candidate was faster
            self.leader = False
            return False
        self._won(updated)
        return True

    async def _create(self, spec: Obj) -> bool:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
            "spec": spec,
        }
        try:
            created = await self.kube.request("POST", self.collection, lease)
        except ConflictError:
            return False
        self._won(created)
        return True

    def _won(self, lease: Obj) -> None:
        if not self.leader:
            log.info("became the leader (Lease %s/%s)", self.settings.namespace, self.settings.name)
        self.leader = True
        self._observe(dict(lease.get("spec") or {}))
        self._renewed_at = self._clock()

    async def _attempt(self, timeout: float | None = None) -> bool:
        """One try, bounded in time; errors count as a failed try."""
        try:
            return await asyncio.wait_for(
                self.try_acquire_or_renew(), timeout=timeout or self.settings.retry_period * 2
            )
        except TRANSIENT as error:
            log.warning("leader election: %s", error)
            return False

    async def acquire(self) -> None:
        """Wait until we are the leader."""
        logged: str | None = None
        while not await self._attempt():
            if self.holder and self.holder != logged:
                log.info("standing by: %s leads", self.holder)
                logged = self.holder
            await asyncio.sleep(self.settings.retry_period)

    def _since_renewal(self) -> float:
        return self._clock() - (self._renewed_at or 0.0)

    async def hold(self) -> None:
        """Renew until leadership is lost, then return (the caller must stop acting).

        No try outlasts the renew deadline, so the leader gives up at most `renew_deadline`
        after its last renewal: before any candidate, which waits `lease_duration` from when
        it saw that renewal, may take over."""
        assert self._renewed_at is not None
        retry, deadline = self.settings.retry_period, self.settings.renew_deadline
        while True:
            await asyncio.sleep(min(retry, max(0.0, deadline - self._since_renewal())))
            left = deadline - self._since_renewal()
            if left > 0 and await self._attempt(timeout=min(left, retry * 2)):
                continue
            if self.holder not in (None, self.settings.identity):
                log.error("lost the Lease to %s", self.holder)
                break
            if self._since_renewal() >= deadline:
                log.error(
                    "could not renew the Lease for %.0f s (renew deadline)",
                    self.settings.renew_deadline,
                )
                break
        self.leader = False

    async def release(self) -> None:
        """Give the Lease up at once (clean shutdown), so a standby need not wait it out."""
        if not self.leader:
            return
        self.leader = False
        try:
            lease = await self.kube.request("GET", self.path)
            spec = release(dict(lease.get("spec") or {}), self.settings.identity, datetime.now(UTC))
            if spec is not None:
                lease["spec"] = spec
                await self.kube.request("PUT", self.path, lease)
                log.info("released the Lease")
        except TRANSIENT as error:
            log.warning("could not release the Lease: %s", error)
