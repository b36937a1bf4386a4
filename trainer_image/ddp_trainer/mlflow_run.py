"""One MLflow run per job, rank 0's, when the environment names a tracking server
(`MLFLOW_TRACKING_URI`, and MLflow's other variables: `MLFLOW_EXPERIMENT_NAME`,
`MLFLOW_TRACKING_TOKEN`, ...).

A job's run carries its name and namespace as tags (`kubeddp.io/job-name`,
`kubeddp.io/job-namespace`). A process that resumes from a checkpoint continues the job's
newest run that did not finish, rather than opening another; one that starts from step 0 opens
a run of its own, its params the trainer's options, the world size and the accelerator. MLflow
cannot take back what it stored, so a resumed run logs only steps past the last one it holds:
steps trained again after a crash keep the values first logged, and no metric goes back.

Metrics go out in the background (MLflow's asynchronous logging): a slow server never holds a
step. `close` waits for them, then sets the newest checkpoint's location as a tag and the
run's status: FINISHED, FAILED, or KILLED for a stop on SIGTERM (resumed later).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from ddp_trainer import contract

log = logging.getLogger(__name__)

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_NAME_ENV = "MLFLOW_EXPERIMENT_NAME"
EXPERIMENT_ID_ENV = "MLFLOW_EXPERIMENT_ID"
JOB_NAME_TAG = "kubeddp.io/job-name"
JOB_NAMESPACE_TAG = "kubeddp.io/job-namespace"
CHECKPOINT_TAG = "kubeddp.io/checkpoint"
STATUS = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


class MlflowRun:
    """Metrics by step into one run; `high_water` keeps a resumed run's steps going forward."""

    def __init__(self, client: Any, run_id: str, high_water: dict[str, int]) -> None:
        self.client = client
        self.run_id = run_id
        self.high_water = high_water  # metric -> the last step the run holds

    @classmethod
    def open(
        cls, env: Mapping[str, str], *, params: Mapping[str, object], resumed: bool
    ) -> MlflowRun:
        from mlflow import MlflowClient  # here: mlflow is optional
        from mlflow.entities import Param

        for name, value in contract.MLFLOW_HTTP_ENV.items():
            os.environ.setdefault(name, value)  # MLflow reads these from the process
        client = MlflowClient(tracking_uri=env[TRACKING_URI_ENV])
        experiment_id = _experiment_id(client, env)
        tags = job_tags(env)
        found = _unfinished_run(client, experiment_id, tags) if resumed and tags else None
        if found is not None:
            run_id = found.info.run_id
            client.update_run(run_id, status="RUNNING")
            high_water = {
                key: max(point.step for point in client.get_metric_history(run_id, key))
                for key in found.data.metrics
            }
            log.info("MLflow: continuing run %s", run_id)
            return cls(client, run_id, high_water)
        run = client.create_run(experiment_id, tags=tags, run_name=env.get(contract.JOB_NAME))
        run_id = run.info.run_id
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        log.info("MLflow: run %s in experiment %s", run_id, experiment_id)
        return cls(client, run_id, {})

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, step)
            for key, value in values.items()
            if step > self.high_water.get(key, -1)
        ]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics, synchronous=False)

    def flush(self, wait: bool = False) -> None:
        if wait:
            import mlflow

            mlflow.flush_async_logging()

    def close(self, outcome: str, checkpoint: str | None) -> None:
        self.flush(wait=True)
        if checkpoint is not None:
            self.client.set_tag(self.run_id, CHECKPOINT_TAG, checkpoint)
        if outcome in STATUS:
            self.client.set_terminated(self.run_id, status=STATUS[outcome])


def job_tags(env: Mapping[str, str]) -> dict[str, str]:
    """The job's name and namespace, where kube-ddp runs it (else none)."""
    name, namespace = env.get(contract.JOB_NAME), env.get(contract.JOB_NAMESPACE)
    return {JOB_NAME_TAG: name, JOB_NAMESPACE_TAG: namespace} if name and namespace else {}


def _experiment_id(client: Any, env: Mapping[str, str]) -> str:
    """MLflow's own choice: MLFLOW_EXPERIMENT_ID, MLFLOW_EXPERIMENT_NAME (made when missing),
    else the server's default experiment."""
    if env.get(EXPERIMENT_ID_ENV):
        return env[EXPERIMENT_ID_ENV]
    name = env.get(EXPERIMENT_NAME_ENV)
    if not name:
        return "0"
    experiment = client.get_experiment_by_name(name)
    return str(experiment.experiment_id if experiment else client.create_experiment(name))


def _unfinished_run(client: Any, experiment_id: str, tags: Mapping[str, str]) -> Any:
    """The newest run with these tags that did not finish, or None."""
    match = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"{match} and attributes.status != 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None
