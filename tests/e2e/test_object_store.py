"""Checkpoints in an S3-compatible object store, on the real node: versitygw runs on the host
(tests/s3_server.py) at the pods' gateway address, the job names it by `trainer.checkpointDir:
s3://...` and its credentials by `checkpointStore.secretName`; a rank SIGKILLed mid-run
restarts the group, which resumes from the checkpoint in the bucket.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.operator_support import Jobs
from tests.cluster.support import load_dev_cluster, wait_for
from tests.e2e.platform import DevPlatform, Platform
from tests.e2e.test_jobs import DIGITS, TRAINING_TIMEOUT, cpu_job, logs
from tests.s3_server import S3Server, running_s3_server


@pytest.fixture
def s3(platform: Platform, tmp_path: Path) -> Iterator[S3Server]:
    if not isinstance(platform, DevPlatform):
        pytest.skip("the object store runs on the dev cluster's host, the real node")
    # The pods' bridge address: the host as the pods reach it.
    with running_s3_server(tmp_path / "s3", host=load_dev_cluster().node.GATEWAY) as server:
        yield server


def test_a_killed_rank_resumes_from_the_checkpoint_in_the_object_store(
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
        "model": "wide-resnet",  # epochs slow enough to be killed between
        "wrnDepth": 10,
        "wrnWidth": 1,
        "epochs": 4,
        "checkpointDir": f"s3://{bucket}/resume",
    }
    spec = {"trainer": trainer, "checkpointStore": {"secretName": secret}}
    jobs.create(cpu_job(platform, "s3resume", **spec))

    def two_epochs_or_failed() -> bool:
        status = jobs.status("s3resume")
        return (
            status.get("phase") == "Failed" or (status.get("training") or {}).get("epoch", 0) >= 2
        )

    wait_for(
        two_epochs_or_failed,
        "two epochs (and their checkpoints in the bucket)",
        timeout=TRAINING_TIMEOUT,
        interval=0.5,
    )
    assert jobs.status("s3resume").get("phase") != "Failed", jobs.status("s3resume")
    platform.kill(jobs.cluster.core.read_namespaced_pod("s3resume-worker-1", jobs.namespace))
    status = jobs.wait_phase("s3resume", "Succeeded", timeout=TRAINING_TIMEOUT)
    assert status["restarts"] == 1
    assert (status["failure"]["pod"], status["failure"]["exitCode"]) == ("s3resume-worker-1", 137)
    resumed = logs(jobs, "s3resume-worker-0")
    where = f"s3://{bucket}/resume/checkpoint-step-"
    found = re.search(rf"resuming at step (\d+) .* from {where}", resumed)
    assert found, resumed[-2000:]
    objects = s3.client().list_objects_v2(Bucket=bucket, Prefix="resume/")["Contents"]
    newest = max(o["Key"] for o in objects)  # the last epoch's, after the resume
    assert int(newest.removeprefix("resume/checkpoint-step-").removesuffix(".pt")) > int(found[1])
