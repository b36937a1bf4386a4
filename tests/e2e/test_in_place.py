"""Restarts in place on the real node (docs/design.md, "Failure rules"): a rank killed in a pod
that stays is restarted there by the pod's agent; a deleted worker is the only pod created again;
an elastic job that loses a worker trains on with the others and takes the replacement back.

Each job is the digits MLP on CPU with a checkpoint every epoch, so a restart resumes where the
group was; the waits after each fault are printed."""

from __future__ import annotations

import time
from typing import Any

from kube_ddp.reasons import Reason
from tests.cluster.operator_support import Jobs
from tests.cluster.support import wait_for
from tests.e2e.platform import Platform
from tests.e2e.test_jobs import DIGITS, TRAINING_TIMEOUT, cpu_job, logs

# From a fault to the job's end: the relaunched ranks import torch again, on 2 shared cores.
FAULT_TIMEOUT = TRAINING_TIMEOUT


def in_place_job(platform: Platform, jobs: Jobs, name: str, **spec: Any) -> dict[str, Any]:
    """A short job that checkpoints every epoch to a directory on the node."""
    checkpoints = platform.scratch_volume("checkpoints", jobs.namespace)
    trainer = {**DIGITS, "model": "mlp", "epochs": 12, "checkpointDir": "/checkpoints"}
    return cpu_job(
        platform,
        name,
        trainer=trainer,
        template={
            "volumes": [checkpoints],
            "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}],
        },
        **spec,
    )


def wait_training(jobs: Jobs, name: str, epochs: int = 2) -> dict[str, Any]:
    return wait_for(
        lambda: (s := jobs.status(name)).get("training", {}).get("epoch", 0) >= epochs and s,
        f"{name}: {epochs} epochs (and their checkpoints)",
        timeout=TRAINING_TIMEOUT,
        interval=0.5,
    )


def uids(jobs: Jobs, name: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in jobs.pods(name)}


def event_messages(jobs: Jobs, name: str, reason: str) -> list[str]:
    items = jobs.cluster.core.list_namespaced_event(
        jobs.namespace, field_selector=f"involvedObject.name={name},reason={reason}"
    ).items
    return [e.message for e in items]


def test_a_killed_rank_restarts_in_place_and_every_pod_stays(
    platform: Platform, jobs: Jobs
) -> None:
    """Worker 1's rank is SIGKILLed (its agent, the pod's main process, lives): the agents
    restart the ranks in place, one restart is counted with a RestartedInPlace Event naming
    the rank and 137, no pod is recreated, and the job finishes from its checkpoint."""
    jobs.create(in_place_job(platform, jobs, "crash"))
    wait_training(jobs, "crash")
    before = uids(jobs, "crash")
    victim = jobs.cluster.core.read_namespaced_pod("crash-worker-1", jobs.namespace)
    platform.kill_rank(victim)
    killed = time.monotonic()
    status = wait_for(
        lambda: (s := jobs.status("crash")).get("restarts", 0) >= 1 and s,
        "the restart in place to be counted",
        timeout=FAULT_TIMEOUT,
        interval=0.5,
    )
    print(f"rank killed -> restart in place counted: {time.monotonic() - killed:.1f} s")
    assert uids(jobs, "crash") == before  # the same pods
    assert status["attempt"] == 0, status
    (said,) = event_messages(jobs, "crash", Reason.RESTARTED_IN_PLACE)
    assert "(pod crash-worker-1) exited with code 137" in said and said.startswith("rank "), said
    status = jobs.wait_phase("crash", "Succeeded", timeout=FAULT_TIMEOUT)
    print(f"rank killed -> Succeeded: {time.monotonic() - killed:.1f} s")
    assert status["restarts"] == 1, status
    assert (status["failure"]["pod"], status["failure"]["exitCode"]) == ("crash-worker-1", 137)
    assert status["failure"]["reason"] == Reason.RESTARTED_IN_PLACE
    assert "resuming at step" in logs(jobs, "crash-worker-0")


def test_a_deleted_worker_is_the_only_pod_created_again(platform: Platform, jobs: Jobs) -> None:
    """`kubectl delete pod` of worker 1 while it trains: a preemption. Only worker 1 is created
    again, under the same attempt and at once, while the deleted pod still saves (so under a
    name of its own, with the worker's hostname); worker 0 keeps its pod (its agent and the
    rendezvous' store) and the job finishes."""
    jobs.create(in_place_job(platform, jobs, "single"))
    wait_training(jobs, "single")
    before = jobs.wait_workers("single", 2)
    jobs.cluster.kubectl("delete", "pod", "single-worker-1", "-n", jobs.namespace, "--wait=false")
    deleted = time.monotonic()

    def replaced() -> dict[int, Any] | None:
        now = jobs.wait_workers("single", 2, timeout=60)
        return now if now[1].metadata.uid != before[1].metadata.uid else None

    after = wait_for(replaced, "worker 1 created again", timeout=FAULT_TIMEOUT)
    print(f"worker 1 deleted -> its successor running: {time.monotonic() - deleted:.1f} s")
    assert after[0].metadata.uid == before[0].metadata.uid
    assert (after[1].metadata.name, after[1].spec.hostname) == (
        "single-worker-1-r1",
        "single-worker-1",
    )
    status = jobs.wait_phase("single", "Succeeded", timeout=FAULT_TIMEOUT)
    print(f"worker 1 deleted -> Succeeded: {time.monotonic() - deleted:.1f} s")
    assert status["attempt"] == 0, status
    assert (status["restarts"], status["preemptions"]) == (0, 1), status
    assert status["lastPreemption"]["reason"] == "Deleted", status
    jobs.wait_events("single", Reason.PREEMPTED)


def test_an_elastic_job_loses_a_worker_and_trains_on(platform: Platform, jobs: Jobs) -> None:
    """3 workers, `elastic: {minNodes: 2, maxNodes: 3}`: worker 2 is lost (its pod's process
    SIGKILLed); the other two re-form and train on (the job stays Running), worker 2 is
    replaced alone, and the job finishes with the loss still going down."""
    spec = {"nodes": 3, "elastic": {"minNodes": 2, "maxNodes": 3}}
    jobs.create(in_place_job(platform, jobs, "stretch", **spec))
    before = wait_training(jobs, "stretch")
    loss_before = before["training"]["loss"]
    first = uids(jobs, "stretch")
    victim = jobs.cluster.core.read_namespaced_pod("stretch-worker-2", jobs.namespace)
    platform.kill(victim)
    lost = time.monotonic()
    status = jobs.wait_phase("stretch", "Succeeded", timeout=FAULT_TIMEOUT)
    print(f"worker 2 lost -> Succeeded: {time.monotonic() - lost:.1f} s")
    assert status["attempt"] == 0, status
    assert status["restarts"] == 1, status
    assert status["failure"]["pod"] == "stretch-worker-2", status
    jobs.wait_events("stretch", Reason.WORKER_REPLACED)
    assert uids(jobs, "stretch")["stretch-worker-0"] == first["stretch-worker-0"]
    training = status["training"]
    assert training["epoch"] == 12
    assert training["loss"] < loss_before, (loss_before, training)
