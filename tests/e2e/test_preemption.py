"""Preemption on a real node: a group stopped from outside (a suspend, an eviction through the
Eviction API as `kubectl drain` makes) saves and resumes, no restart counted, and the job says
it was preempted and by what (docs/design.md, "Preemption").

First with a worker that only traps SIGTERM and exits 86 (the operator's side alone), then with
the trainer, which saves at the step the ranks agree on and resumes from it.
"""

from __future__ import annotations

import time
from typing import Any

from ddp_trainer import contract
from kube_ddp import names
from kube_ddp.reasons import Reason
from tests.cluster.operator_support import Jobs
from tests.cluster.support import wait_for
from tests.e2e.platform import Platform
from tests.e2e.test_jobs import DIGITS, RECREATE, TRAINING_TIMEOUT, cpu_job, logs

GRACE = 5  # seconds: the trap answers at once; the trainer's tiny saves take well under this
# A worker that saves nothing but answers SIGTERM as the trainer does: the preempted code.
TRAPS_SIGTERM = [
    "sh",
    "-c",
    f"trap 'echo preempted; exit {names.EXIT_PREEMPTED}' TERM; "
    "echo started; while :; do sleep 1 & wait $!; done",
]


def trapping_job(platform: Platform, name: str) -> dict[str, Any]:
    """A group whose pods are the program itself (Recreate: no agent in front of it), which
    saves and exits 86 on SIGTERM."""
    template = {"terminationGracePeriodSeconds": GRACE}
    return cpu_job(platform, name, command=TRAPS_SIGTERM, template=template, runPolicy=RECREATE)


def set_suspend(jobs: Jobs, name: str, suspend: bool) -> None:
    body = {"spec": {"runPolicy": {"suspend": suspend}}}
    jobs.cluster.custom_objects.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, jobs.namespace, names.PLURAL, name, body
    )


def evict(jobs: Jobs, pod: str) -> None:
    """What `kubectl drain` does to each pod: an Eviction through the API."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": jobs.namespace},
    }
    jobs.cluster.core.create_namespaced_pod_eviction(pod, jobs.namespace, eviction)


def wait_preempted(jobs: Jobs, name: str, count: int, timeout: float = 60) -> dict[str, Any]:
    return wait_for(
        lambda: (s := jobs.status(name)).get("preemptions", 0) >= count and s,
        f"{name} to count {count} preemption(s)",
        timeout=timeout,
        interval=0.5,
    )


def test_a_suspended_group_is_preempted_and_resumes_uncounted(
    platform: Platform, jobs: Jobs
) -> None:
    """Suspended while it runs: a preemption by `Suspended`, its workers' 86 no failure;
    resumed, no restart counted."""
    started = time.monotonic()
    jobs.create(trapping_job(platform, "pause"))
    jobs.wait_pods("pause", 2, timeout=60)
    set_suspend(jobs, "pause", True)
    status = jobs.wait_phase("pause", "Suspended", timeout=30)
    last = status["lastPreemption"]
    assert (status["preemptions"], last["reason"]) == (1, Reason.SUSPENDED), status
    wait_for(lambda: not jobs.pods("pause"), "the suspended job's pods to be gone", timeout=30)
    set_suspend(jobs, "pause", False)
    status = jobs.wait_phase("pause", "Running", timeout=60)
    assert (status["restarts"], status["preemptions"]) == (0, 1), status
    assert status.get("failure") is None, status
    print(f"suspend and resume: {time.monotonic() - started:.1f} s")


def test_a_drained_worker_saves_and_the_group_resumes_uncounted(
    platform: Platform, jobs: Jobs
) -> None:
    """One worker evicted as `kubectl drain` does: it exits 86, the group is recreated under
    the same attempt, and the job says it was preempted by EvictionByEvictionAPI."""
    started = time.monotonic()
    jobs.create(trapping_job(platform, "drain"))
    old = {p.metadata.uid for p in jobs.wait_pods("drain", 2, timeout=60)}
    evict(jobs, "drain-worker-1")
    status = wait_preempted(jobs, "drain", 1)
    last = status["lastPreemption"]
    assert last["reason"] == "EvictionByEvictionAPI", last
    assert last["message"].startswith("drain-worker-1"), last
    # the next group, same attempt: the preemption counted no restart
    wait_for(
        lambda: old.isdisjoint(p.metadata.uid for p in jobs.wait_pods("drain", 2, timeout=60)),
        "the next group's pods to run",
        timeout=60,
    )
    status = jobs.wait_phase("drain", "Running", timeout=30)
    assert (status["restarts"], status["preemptions"]) == (0, 1), status
    assert status.get("failure") is None, status
    jobs.wait_events("drain", Reason.PREEMPTED)
    print(f"eviction -> resumed and running: {time.monotonic() - started:.1f} s")


def global_step(training: dict[str, Any]) -> int:
    return int(training["epoch"]) * int(training["stepsPerEpoch"]) + int(training["step"])


# A heartbeat a second and steps of at least 50 ms (the trainer's test hook: a batch log in the
# container's /tmp, a pause after each step): an epoch of about 90 steps outlasts several
# heartbeats and a signal's way from the API to the ranks, however idle or busy the machine.
SLOW_STEPS_ENV = [
    {"name": contract.HEARTBEAT_ENV, "value": "1"},
    {"name": "DDP_TRAINER_BATCH_LOG", "value": "/tmp/steps"},
    {"name": "DDP_TRAINER_STEP_SECONDS", "value": "0.05"},
]


def wait_early_in_an_epoch(jobs: Jobs, name: str) -> dict[str, Any]:
    """Rank 0's report from the first half of an epoch after the first: a signal sent now
    reaches the ranks before that epoch ends, so their save is mid-epoch."""

    def early() -> dict[str, Any] | None:
        training = jobs.status(name).get("training") or {}
        step, half = training.get("step") or 0, (training.get("stepsPerEpoch") or 0) // 2
        return training if training.get("epoch", 0) >= 1 and 0 < step <= half else None

    return wait_for(early, f"{name}: a report early in an epoch after the first", TRAINING_TIMEOUT)


def test_the_trainer_suspended_mid_epoch_resumes_from_the_step_it_reached(
    platform: Platform, jobs: Jobs
) -> None:
    """The trainer (2 workers, digits): suspended mid-epoch, its ranks agree on a step, rank 0
    saves there and both exit 86; resumed, it starts from that step (not an epoch boundary:
    only epoch checkpoints besides, so a lost SIGTERM save would show), the loss going on from
    where it was, no restart counted."""
    started = time.monotonic()
    trainer = {
        **DIGITS,
        "batchSize": 8,  # about 90 steps an epoch: a suspend lands mid-epoch
        "lr": 0.02,  # the default 0.1 diverges at this batch size, preempted or not
        "model": "mlp",
        "epochs": 40,
        "checkpointDir": "/checkpoints",
        "checkpointEverySeconds": 0,
    }
    checkpoints = platform.scratch_volume("checkpoints", jobs.namespace)
    template = {
        "terminationGracePeriodSeconds": GRACE * 4,
        "volumes": [checkpoints],
        "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}],
    }
    job = cpu_job(platform, "midway", trainer=trainer, template=template, env=SLOW_STEPS_ENV)
    jobs.create(job)
    before = wait_early_in_an_epoch(jobs, "midway")
    set_suspend(jobs, "midway", True)
    suspended = jobs.wait_phase("midway", "Suspended", timeout=30)
    assert suspended["lastPreemption"]["reason"] == Reason.SUSPENDED
    wait_for(lambda: not jobs.pods("midway"), "the suspended job's pods to be gone", timeout=30)
    saved = jobs.status("midway")["training"]["checkpoint"]["step"]  # the SIGTERM's save
    assert saved >= global_step(before), (saved, before)  # where it had got to, or later
    assert saved % before["stepsPerEpoch"] != 0, (saved, before)  # mid-epoch
    set_suspend(jobs, "midway", False)

    def resumed() -> dict[str, Any] | None:
        status = jobs.status("midway")
        step = (status.get("lastPreemption") or {}).get("resumedFromStep")
        return status if step else None  # the resumed attempt's own, not the first's 0

    status = wait_for(resumed, "the resumed attempt's report", timeout=TRAINING_TIMEOUT)
    training = status["training"]
    assert status["lastPreemption"]["resumedFromStep"] == saved, (saved, status)
    assert training["resumedFromStep"] == saved
    assert (status["restarts"], status["preemptions"]) == (0, 1), status
    # the loss goes on from where it was, not from an untrained model's
    assert training["loss"] <= before["loss"] * 1.5, (before, training)
    assert f"resuming at step {saved}" in logs(jobs, "midway-worker-0")
    print(f"the trainer suspended and resumed: {time.monotonic() - started:.1f} s")
