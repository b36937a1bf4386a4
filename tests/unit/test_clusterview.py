"""`kube-ddp describe`'s screen and `logs`' merge order, from objects as kubectl returns them
(tests/cluster/test_clusterview.py runs both against the real API server)."""

from __future__ import annotations

from datetime import UTC, datetime

from kube_ddp.clusterview import describe, sortable_timestamp

NOW = datetime(2026, 11, 23, 16, 0, 0, tzinfo=UTC)


def test_the_screen_shows_phase_failure_progress_pods_and_events() -> None:
    job = {
        "metadata": {"name": "bar", "namespace": "team-a"},
        "spec": {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}},
        "status": {
            "phase": "Failed",
            "restarts": 3,
            "startTime": "2026-11-23T15:00:00Z",
            "completionTime": "2026-11-23T15:58:00Z",
            "workers": {"total": 2, "failed": 1, "running": 0},
            "failure": {"pod": "bar-worker-1", "exitCode": 137, "reason": "OOMKilled"},
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "bar-worker-1 exited with code 137 (OOMKilled); backoffLimit 3",
                    "lastTransitionTime": "2026-11-23T15:58:00Z",
                }
            ],
            "training": {
                "epoch": 7,
                "epochs": 30,
                "valAccuracy": 0.884,
                "worldSize": 12,
                "updatedAt": "2026-11-23T15:57:30Z",
            },
        },
    }
    pod = {
        "metadata": {
            "name": "bar-worker-1",
            "creationTimestamp": "2026-11-23T15:40:00Z",
            "labels": {"kubeddp.io/replica-index": "1", "kubeddp.io/attempt": "3"},
        },
        "spec": {"nodeName": "gpu-node-1"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                }
            ],
        },
    }
    event = {
        "type": "Warning",
        "reason": "BackoffLimitExceeded",
        "message": "bar-worker-1 exited\n with code 137",
        "lastTimestamp": "2026-11-23T15:58:00Z",
        "involvedObject": {"kind": "DDPTrainingJob", "name": "bar"},
    }
    screen = describe(job, [pod], [event], NOW)
    assert "Phase:        Failed\n" in screen
    assert "Restarts:     3 of at most 3\n" in screen
    assert "Accelerator:  nvidia x 8 per node, backend auto\n" in screen
    assert "Completed:    2026-11-23T15:58:00Z (2m ago)\n" in screen
    assert (
        "Training:     epoch 7/30  val-acc 0.8840  12 ranks  reported 2026-11-23T15:57:30Z (2m ago)"
        in screen
    )
    assert "Failure:      bar-worker-1 exit 137 (OOMKilled)\n" in screen
    assert (
        "  Failed  True    BackoffLimitExceeded  2m   bar-worker-1 exited with code 137" in screen
    )
    assert "  bar-worker-1  Failed  3        gpu-node-1  137   OOMKilled  20m" in screen
    assert (
        "Warning  BackoffLimitExceeded  ddptrainingjob/bar  bar-worker-1 exited with code 137"
        in screen
    )


def test_a_job_nobody_has_reconciled_yet() -> None:
    screen = describe({"metadata": {"name": "bar"}, "spec": {"nodes": 2}}, [], [], NOW)
    assert "Phase:        -\n" in screen and "Workers:      2\n" in screen
    assert "Pods:\n  <none>\n" in screen and "Events:\n  <none>\n" in screen


def test_log_lines_merge_by_time_to_the_nanosecond() -> None:
    stamps = ["2026-11-23T16:00:00.51Z", "2026-11-23T16:00:00.5Z", "2026-11-23T16:00:01Z"]
    assert sorted(stamps, key=sortable_timestamp) == [stamps[1], stamps[0], stamps[2]]
