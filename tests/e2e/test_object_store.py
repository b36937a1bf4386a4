"""Checkpoints in an S3-compatible object store, on the real node: versitygw runs on the host
(tests/s3_server.py) at the pods' gateway address, the job names it by `trainer.checkpointDir:
s3://...` and its credentials by `checkpointStore.secretName`; a worker evicted mid-epoch as
`kubectl drain` does makes the ranks save at the step they agree on, and the group resumes from
that checkpoint in the bucket, no restart counted. (A SIGKILLed rank's resume, from a volume, is
test_jobs.py's; the store is the same either way.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.operator_support import Jobs
from tests.cluster.support import load_dev_cluster, wait_for
from tests.e2e.platform import DevPlatform, Platform
from tests.e2e.test_jobs import DIGITS, RECREATE, TRAINING_TIMEOUT, cpu_job, logs
from tests.e2e.test_preemption import (
    GRACE,
    SLOW_STEPS_ENV,
    evict,
    global_step,
    wait_early_in_an_epoch,
    wait_preempted,
)
from tests.s3_server import S3Server, running_s3_server


@pytest.fixture
def s3(platform: Platform, tmp_path: Path) -> Iterator[S3Server]:
    if not isinstance(platform, DevPlatform):
        pytest.skip("the object store runs on the dev cluster's host, the real node")
    # The pods' bridge address: the host as the pods reach it.
    with running_s3_server(tmp_path / "s3", host=load_dev_cluster().node.GATEWAY) as server:
        yield server


def test_a_drained_trainer_saves_to_the_object_store_and_resumes_from_that_step(
    platform: Platform, jobs: Jobs, s3: S3Server
) -> None:
    bucket = s3.create_bucket()
    secret = f"s3-{uuid.uuid4().hex[:6]}"
    keys = {k: v for k, v in s3.env().items() if k != "AWS_REGION"}  # region: the default
    jobs.cluster.core.create_namespaced_secret(
        jobs.namespace, {"metadata": {"name": secret}, "stringData": keys}
    )
    trainer: dict[str, Any] = {
        **DIGITS,
        "batchSize": 8,  # about 90 steps an epoch: the eviction lands mid-epoch
        "lr": 0.02,
        "model": "mlp",
        "epochs": 40,  # still training when it has resumed
        "checkpointDir": f"s3://{bucket}/resume",
        "checkpointEverySeconds": 0,  # epoch ends and the SIGTERM's save only
    }
    spec = {
        "trainer": trainer,
        "checkpointStore": {"secretName": secret},
        "template": {"terminationGracePeriodSeconds": GRACE * 4},
        "env": SLOW_STEPS_ENV,
        "runPolicy": RECREATE,  # the group resumes; in place, worker 1 alone would
    }
    jobs.create(cpu_job(platform, "s3drain", **spec))
    before = wait_early_in_an_epoch(jobs, "s3drain")
    evict(jobs, "s3drain-worker-1")
    preempted = wait_preempted(jobs, "s3drain", 1)
    assert preempted["lastPreemption"]["reason"] == "EvictionByEvictionAPI", preempted

    def resumed() -> dict[str, Any] | None:
        status = jobs.status("s3drain")
        step = (status.get("lastPreemption") or {}).get("resumedFromStep")
        return status if step else None  # the resumed attempt's own, not the first's 0

    status = wait_for(resumed, "the resumed attempt's report", timeout=TRAINING_TIMEOUT)
    assert (status["restarts"], status["preemptions"]) == (0, 1), status
    saved = status["lastPreemption"]["checkpointStep"]  # the step the SIGTERM's save holds
    assert saved >= global_step(before) and saved % before["stepsPerEpoch"], (saved, before)
    assert status["lastPreemption"]["resumedFromStep"] == saved, status
    where = f"s3://{bucket}/resume/checkpoint-step-{saved:010d}.pt"
    log = logs(jobs, "s3drain-worker-0")
    assert f"resuming at step {saved} " in log and where in log, log[-2000:]
