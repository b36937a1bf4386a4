"""Leader election on the real API server: the Lease elector itself, and two `kube-ddp
operator` processes with the chart's ServiceAccount, of which the leader is killed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kube_ddp.config import LeaseSettings
from kube_ddp.kube import Kube
from kube_ddp.leadership import LeaseElector
from tests.cluster.helm_support import CHART, TEST_IMAGE, Helm, Operator, service_account_kubeconfig
from tests.cluster.operator_support import Jobs, job_manifest, running_operator
from tests.cluster.support import Cluster, fresh_namespace, wait_for

GPU_2X8 = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}}
# The group path: a restart recreates every pod, the next attempt (in place is the default)
RECREATE = {"restartStrategy": "Recreate"}
# Short timings keep the test quick; the chart's defaults are 15 / 10 / 2 s.
DURATION, DEADLINE, RETRY = 4.0, 3.0, 1.0


def electors(namespace: str, name: str, *identities: str) -> list[LeaseElector]:
    return [
        LeaseElector(
            Kube(),
            LeaseSettings(
                name=name,
                namespace=namespace,
                identity=identity,
                lease_duration=DURATION,
                renew_deadline=DEADLINE,
                retry_period=RETRY,
            ),
        )
        for identity in identities
    ]


def test_lease_elector(cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))

    async def scenario() -> None:
        a, b = electors(namespace, "lease", "a", "b")
        c, d = electors(namespace, "race", "c", "d")
        try:
            assert await a.try_acquire_or_renew() is True  # creates the Lease
            assert await b.try_acquire_or_renew() is False
            assert b.holder == "a"
            assert await a.try_acquire_or_renew() is True  # renews
            # a goes silent: b takes over after the lease duration, by b's own clock.
            started = time.monotonic()
            await asyncio.wait_for(b.acquire(), timeout=DURATION * 3)
            waited = time.monotonic() - started
            assert DURATION - RETRY <= waited <= DURATION + 2 * RETRY, waited
            assert await a.try_acquire_or_renew() is False
            assert a.holder == "b"
            # A clean stop releases the Lease: the next try of a standby wins at once.
            await b.release()
            assert await a.try_acquire_or_renew() is True
            # Two candidates at once: exactly one wins (create, then update, each with 409).
            assert sorted(
                await asyncio.gather(c.try_acquire_or_renew(), d.try_acquire_or_renew())
            ) == [
                False,
                True,
            ]
        finally:
            for elector in (a, b, c, d):
                await elector.kube.close()

    asyncio.run(scenario())
    lease = cluster.kubectl("get", "lease", "lease", "-n", namespace, "-o", "yaml").stdout
    assert "holderIdentity: a" in lease and "leaseTransitions: 2" in lease


@pytest.fixture
def jobs_namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster, f"jobs-{uuid.uuid4().hex[:8]}") as name:
        yield name


def test_killed_leader_is_replaced_within_seconds_without_duplicates(
    cluster: Cluster,
    helm: Helm,
    crd: None,
    namespace: str,
    jobs_namespace: str,
    tmp_path: Path,
) -> None:
    release = f"kddp-{uuid.uuid4().hex[:6]}"
    fullname = f"{release}-kube-ddp"
    helm.run(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        *TEST_IMAGE,
        "--set",
        f"watchNamespaces={{{jobs_namespace}}}",
        "--set",
        "replicaCount=2",
    )
    kubeconfig = service_account_kubeconfig(cluster, namespace, fullname, tmp_path / "sa.kc")
    args = (
        f"--namespace={jobs_namespace}",
        "--leader-election",
        f"--leader-election-namespace={namespace}",
        f"--leader-election-id={fullname}",
        f"--lease-duration={DURATION}",
        f"--renew-deadline={DEADLINE}",
        f"--retry-period={RETRY}",
    )
    first = Operator(kubeconfig, args, tmp_path / "first.log").start()
    second = Operator(kubeconfig, args, tmp_path / "second.log")
    processes = [first, second]
    try:
        first.wait_ready("leader: watching")
        second.start()
        assert second.wait_ready("standby:").endswith("leads")

        jobs = Jobs(cluster, jobs_namespace)
        jobs.create(job_manifest("bar", runPolicy=RECREATE, **GPU_2X8))
        first_pods = jobs.wait_pods("bar", 2)
        jobs.wait_phase("bar", "Running")
        assert "kopf" not in second.log()  # the standby has not even started kopf

        first.kill()  # SIGKILL: the Lease is not released
        killed = time.monotonic()
        jobs.end_worker("bar-worker-1", 137)  # a retryable loss that only a leader handles
        second.wait_ready("leader: watching", timeout=DURATION * 3)
        takeover = time.monotonic() - killed
        print(f"takeover after the leader's SIGKILL: {takeover:.1f} s (lease {DURATION} s)")
        assert takeover <= DURATION + 2 * RETRY + 1

        restarted = jobs.wait_pods("bar", 2, attempt=1, timeout=30)
        assert {p.metadata.uid for p in restarted}.isdisjoint(p.metadata.uid for p in first_pods)
        status = jobs.wait_phase("bar", "Running")
        assert status["restarts"] == 1
        # The killed leader comes back (as the kubelet would restart it) as a standby.
        again = Operator(kubeconfig, args, tmp_path / "again.log").start()
        processes.append(again)
        again.wait_ready("standby:")
        time.sleep(2 * RETRY)  # room for a duplicate action, if there were one
        pods: list[Any] = jobs.pods("bar")
        assert sorted((p.metadata.name, p.metadata.labels["kubeddp.io/attempt"]) for p in pods) == [
            ("bar-worker-0", "1"),
            ("bar-worker-1", "1"),
        ]
        assert jobs.status("bar")["restarts"] == 1
        assert "kopf" not in again.log()
    finally:
        for process in processes:
            process.stop()
        for process in processes:
            print(f"---- {process.log_path.name} ----\n" + process.log()[-4000:])
        helm.run("uninstall", release, "-n", namespace)


class SlowPodList:
    """A plain-HTTP front of the API server, with the admin's certificate, that holds back every
    LIST of pods by `delay` seconds (watches and the rest pass at once): an operator behind it
    starts, as after a takeover, while its pods are still being listed."""

    def __init__(self, cluster: Cluster, directory: Path, delay: float) -> None:
        self.upstream, self.delay = cluster.server, delay
        self.pod_lists = 0  # answered
        config = cluster.api.configuration
        self.tls = ssl.create_default_context(cafile=str(cluster.ca_file))
        self.tls.load_cert_chain(config.cert_file, config.key_file)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)
        kubeconfig = directory / "slow.kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "slow", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}
                    ],
                    "users": [{"name": "front", "user": {}}],
                    "contexts": [{"name": "slow", "context": {"cluster": "slow", "user": "front"}}],
                    "current-context": "slow",
                }
            )
        )
        self.cluster = dataclasses.replace(cluster, kubeconfig=kubeconfig)

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
            app = web.Application()
            app.router.add_route("*", "/{path:.*}", self._forward)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            started.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        is_pod_list = (
            request.method == "GET"
            and request.path.endswith("/pods")
            and request.query.get("watch") not in ("true", "1")
        )
        if is_pod_list:
            await asyncio.sleep(self.delay)
        headers = {k: v for k, v in request.headers.items() if k in ("Content-Type", "Accept")}
        async with self.session.request(
            request.method,
            self.upstream + str(request.rel_url),
            data=await request.read() or None,
            headers=headers,
            ssl=self.tls,
        ) as answer:
            response = web.StreamResponse(
                status=answer.status,
                headers={"Content-Type": answer.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        if is_pod_list:
            self.pod_lists += 1
        return response

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


TAKEN_OVER = 20


def test_an_operator_that_starts_while_its_pods_are_listed_restarts_nothing(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    """What a new leader meets: running jobs, their pods not yet listed (held back 5 s here,
    while the jobs come at once). It must decide nothing on a job before it knows the job's
    pods (kopf holds the handlers until the pod index is filled): 20 running jobs keep their
    pods and count no restart; a worker that then fails restarts its group, so it did act."""
    jobs = Jobs(cluster, namespace)
    job_names = [f"kept-{i}" for i in range(TAKEN_OVER)]
    for directory in ("first", "second"):
        (tmp_path / directory).mkdir()
    with running_operator(cluster, namespace, tmp_path / "first"):
        for name in job_names:
            jobs.create(job_manifest(name, nodes=2, runPolicy=RECREATE))
        for name in job_names:
            jobs.wait_phase(name, "Running", timeout=60)
    before = {p.metadata.name: p.metadata.uid for name in job_names for p in jobs.pods(name)}
    assert len(before) == 2 * TAKEN_OVER
    slow = SlowPodList(cluster, tmp_path, delay=5.0)
    try:
        with running_operator(slow.cluster, namespace, tmp_path / "second"):
            wait_for(lambda: slow.pod_lists >= 1, "the held-back pod list", timeout=60)
            time.sleep(3)  # room for a wrong decision, if there were one
            restarts = {name: jobs.status(name).get("restarts", 0) for name in job_names}
            after = {p.metadata.name: p.metadata.uid for name in job_names for p in jobs.pods(name)}
            assert restarts == dict.fromkeys(job_names, 0)
            assert after == before
            jobs.end_worker("kept-0-worker-1", 137)  # what only an operator that acts handles
            jobs.wait_pods("kept-0", 2, attempt=1, timeout=60)
    finally:
        slow.close()
