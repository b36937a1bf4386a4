"""The Python client: DDPTrainingJobs from a notebook or a script, on a cluster or here.

    from kube_ddp import DDPTrainingJobSpec, TrainerClient, TrainerOptions, new_job

    job = new_job("digits", DDPTrainingJobSpec(nodes=2, trainer=TrainerOptions(epochs=3)))
    client = TrainerClient()
    client.train(job)
    client.wait_for_job_status("digits", callbacks=[print_progress])

A shell, as the CLI is: the job is the API's own model (`kube_ddp.api`, which the CRD is
generated from), so a job built here is validated by the rules the API server applies, and a
job read back (`get_job`) is that model with its `status` as `JobStatus`. The calls are the
operator's own (`kube.Kube`, over aiohttp with kopf's credential readers): no second Kubernetes
client library. `run_local` is `kube-ddp run --local`'s engine (`local.runner`).

Names, and where they come from:

- Kubeflow Trainer's SDK (`kubeflow.trainer.TrainerClient`), which Trainer v2's users know:
  `train`, `get_job`, `list_jobs`, `wait_for_job_status` (`status`, `timeout`,
  `polling_interval`, `callbacks`), `get_job_logs` (`follow`), `delete_job`. Where our model
  differs, it wins: `train` takes a whole `DDPTrainingJob` (not a runtime and a trainer
  function), the phases waited for are the job's own (`Succeeded`, not Kubeflow's `Complete`),
  and `get_job_logs` picks a worker by its index (`worker=0`, not `step="node-0"`).
- The kubernetes client's conventions where Kubeflow has none: a client per namespace (the
  kubeconfig context's, the service account's in a pod, or `namespace=`), a `kubeconfig` path
  (its current context: kopf's reader, which the operator uses too, reads only that),
  `suspend_job`/`resume_job` as the patch of `spec.runPolicy.suspend` that
  `kubectl patch` would send.
- `watch_job` yields the job each time its status changes, the iterator `wait_for_job_status`
  is built on; `print_progress` is a ready callback, the progress line of `kube-ddp run --local`.

Errors are typed (`ClientError` and its subclasses), each naming the job and what to do; what
the API server refuses otherwise is `kube.ApiError`'s subclass for its status.

The client runs its own event loop in a thread, so its calls block in a script and in a
notebook alike (whose own loop is already running).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar, get_args
from urllib.parse import urlencode

from kube_ddp import clusterview, names
from kube_ddp.api import (
    DDPTrainingJob,
    DDPTrainingJobSpec,
    JobStatus,
    ObjectMeta,
    Phase,
    load_job,
)
from kube_ddp.kube import (
    BadRequestError,
    Kube,
    NotFoundError,
    collection_path,
    job_path,
    load_credentials,
)
from kube_ddp.local.console import progress_line
from kube_ddp.local.plan import Machine, Overrides
from kube_ddp.local.runner import RunOptions
from kube_ddp.local.runner import run_local as _run_local
from kube_ddp.status import FINISHED

T = TypeVar("T")
PHASES: tuple[str, ...] = get_args(Phase)


# --- errors ---------------------------------------------------------------------------------


class ClientError(Exception):
    """A call that cannot do what was asked of this job: its words name the job and the fix."""

    def __init__(self, job: str, namespace: str, message: str) -> None:
        super().__init__(message)
        self.job = job
        self.namespace = namespace


class JobNotFoundError(ClientError, LookupError):
    """No job of that name in the client's namespace."""


class JobExistsError(ClientError):
    """`train` of a job whose name is taken."""


class _LastSeenError(ClientError):
    def __init__(self, job: str, namespace: str, message: str, last: DDPTrainingJob) -> None:
        super().__init__(job, namespace, message)
        self.last = last


class WaitTimeoutError(_LastSeenError, TimeoutError):
    """A wait ran out of time; `.last` is the job as last seen."""


class JobEndedError(_LastSeenError):
    """The job finished in a phase other than the one waited for; `.last` is the job."""


class JobFailedError(JobEndedError):
    """The job Failed while another phase was waited for; `.last.status.failure` says why."""


class LogsUnavailableError(ClientError):
    """The worker has no pod now, or its pod no log (not started, removed, a node without one)."""


# --- building a job -------------------------------------------------------------------------


def new_job(
    name: str,
    spec: DDPTrainingJobSpec,
    namespace: str | None = None,
    labels: dict[str, str] | None = None,
) -> DDPTrainingJob:
    """A DDPTrainingJob of `spec` named `name`: the models validate it as the API server would."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels is not None:
        metadata["labels"] = labels
    return DDPTrainingJob(
        api_version=names.API_VERSION,
        kind=names.KIND,
        metadata=ObjectMeta(**metadata),
        spec=spec,
    )


def print_progress(job: DDPTrainingJob) -> None:
    """A `wait_for_job_status` callback: `digits  Running  epoch 3/12  val-acc 0.912 ...`."""
    print(progress_line(job.name, job.status or JobStatus()), flush=True)


def run_local(
    job: DDPTrainingJob,
    nodes: int | None = None,
    nproc_per_node: int | None = None,
    cpu: bool = False,
    logs_dir: str | os.PathLike[str] | None = None,
) -> int:
    """Run `job` on this machine as `kube-ddp run --local` does (its worker pods as processes,
    decided by the operator's rules), its output on this process's stdout and stderr. 0 when it
    Succeeded, 1 when it Failed, 130 when interrupted; a job that cannot run here raises
    `local.plan.LocalRunError` (saying what to pass) before anything starts."""
    options = RunOptions(
        overrides=Overrides(nodes=nodes, nproc_per_node=nproc_per_node, cpu=cpu),
        logs_dir=Path(logs_dir) if logs_dir is not None else None,
    )
    return _run_local(job, options, Machine.detect(os.environ), sys.stdout, sys.stderr)


# --- the client -----------------------------------------------------------------------------


class TrainerClient:
    """DDPTrainingJobs in one namespace of the cluster the kubeconfig (or the pod's service
    account) names. Close it (or use it in a `with`) to stop its thread."""

    def __init__(
        self,
        namespace: str | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
    ) -> None:
        path = os.fspath(kubeconfig) if kubeconfig is not None else None
        credentials = functools.partial(load_credentials, path)
        self.namespace: str = namespace or credentials().default_namespace or "default"
        self._kube = Kube(credentials)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kube-ddp-client", daemon=True
        )
        self._thread.start()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._kube.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        """`call` on the client's loop; an interrupt here (Ctrl-C in a notebook) cancels it."""
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    # --- jobs --------------------------------------------------------------------------------

    def train(self, job: DDPTrainingJob) -> str:
        """Create `job` in the client's namespace; its name."""
        if job.metadata.namespace not in (None, self.namespace):
            raise ValueError(
                f"job {job.name} names namespace {job.metadata.namespace}, this client works "
                f"in {self.namespace}: use TrainerClient(namespace={job.metadata.namespace!r}), "
                "or leave the job's namespace unset"
            )
        body = job.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"status"})
        body["metadata"]["namespace"] = self.namespace
        if self._run(self._kube.create(body)) is None:
            raise JobExistsError(
                job.name,
                self.namespace,
                f"job {job.name} exists in namespace {self.namespace}: "
                f'delete_job("{job.name}", wait=True) first, or give this one another name',
            )
        return job.name

    def get_job(self, name: str) -> DDPTrainingJob:
        """The job as the API server has it, `status` included (None before the operator saw it)."""
        found = self._run(self._kube.get(job_path(self.namespace, name)))
        if found is None:
            raise self._not_found(name)
        return load_job(found)

    def get_job_status(self, name: str) -> JobStatus:
        """The job's status (an empty one before the operator wrote any)."""
        return self.get_job(name).status or JobStatus()

    def list_jobs(self) -> list[DDPTrainingJob]:
        """Every job in the client's namespace, by name."""
        path = collection_path(names.API_VERSION, names.KIND, self.namespace)
        listing = self._run(self._kube.request("GET", path))
        jobs = [load_job(item) for item in listing.get("items", [])]
        return sorted(jobs, key=lambda job: job.name)

    def suspend_job(self, name: str) -> DDPTrainingJob:
        """Set `spec.runPolicy.suspend`: the operator removes the pods (a trainer saves a
        checkpoint on the way out) and keeps the job, phase Suspended."""
        return self._suspend(name, True)

    def resume_job(self, name: str) -> DDPTrainingJob:
        """Clear `spec.runPolicy.suspend`: the pods are created again, no restart counted, and
        a trainer resumes from its newest checkpoint."""
        return self._suspend(name, False)

    def _suspend(self, name: str, suspend: bool) -> DDPTrainingJob:
        patch = {"spec": {"runPolicy": {"suspend": suspend}}}
        patched = self._run(self._kube.patch(job_path(self.namespace, name), patch))
        if patched is None:
            raise self._not_found(name)
        return load_job(patched)

    def delete_job(self, name: str, wait: bool = False, timeout: float = 60) -> None:
        """Delete the job; its pods and other children go with it (garbage collection).
        `wait`: return only once the job is gone (its name free for a new one)."""
        path = job_path(self.namespace, name)
        try:
            self._run(self._kube.request("DELETE", path, {"propagationPolicy": "Background"}))
        except NotFoundError:
            raise self._not_found(name) from None
        deadline = time.monotonic() + timeout
        while wait and (left := self._run(self._kube.get(path))) is not None:
            if time.monotonic() > deadline:
                raise WaitTimeoutError(
                    name,
                    self.namespace,
                    f"job {name} in namespace {self.namespace} still exists {timeout:g} s after "
                    "its deletion: a finalizer holds it (is the operator running?)",
                    load_job(left),
                )
            time.sleep(0.2)

    def _not_found(self, name: str) -> JobNotFoundError:
        return JobNotFoundError(
            name,
            self.namespace,
            f"no job {name} in namespace {self.namespace}: list_jobs() shows its jobs "
            "(a finished job with ttlSecondsAfterFinished is deleted by the operator; another "
            "namespace is TrainerClient(namespace=...))",
        )

    # --- waiting -----------------------------------------------------------------------------

    def watch_job(
        self, name: str, timeout: float = 600, polling_interval: float = 2
    ) -> Iterator[DDPTrainingJob]:
        """The job now, then each time its status changes, for `timeout` seconds (then the
        iterator ends). Polled every `polling_interval` seconds."""
        deadline = time.monotonic() + timeout
        last: list[JobStatus | None] = []
        while True:
            job = self.get_job(name)
            if last != [job.status]:
                last = [job.status]
                yield job
            if time.monotonic() + polling_interval > deadline:
                return
            time.sleep(polling_interval)

    def wait_for_job_status(
        self,
        name: str,
        status: Iterable[str] = ("Succeeded",),
        timeout: float = 600,
        polling_interval: float = 2,
        callbacks: Iterable[Callable[[DDPTrainingJob], None]] = (),
    ) -> DDPTrainingJob:
        """Wait until the job's phase is one of `status`; the job then. Each callback gets the
        job each time its status changes (phase, workers, the trainer's progress). A job that
        Failed, or Succeeded, outside `status` raises `JobFailedError` or `JobEndedError`; no
        such phase in `timeout` seconds raises `WaitTimeoutError`."""
        wanted = set(status)
        unknown = wanted - set(PHASES)
        if not wanted or unknown:
            raise ValueError(f"status: phases among {', '.join(PHASES)}, got {sorted(wanted)}")
        said = " or ".join(sorted(wanted))
        hooks = list(callbacks)
        job: DDPTrainingJob | None = None
        for job in self.watch_job(name, timeout, polling_interval):
            for hook in hooks:
                hook(job)
            phase = job.status.phase if job.status else None
            if phase in wanted:
                return job
            if phase in FINISHED:
                raise self._ended(job, said)
        assert job is not None  # watch_job yields the job at least once, or raises
        now = (job.status.phase if job.status else None) or "not yet seen by the operator"
        raise WaitTimeoutError(
            name,
            self.namespace,
            f"job {name} in namespace {self.namespace} is {now} after {timeout:g} s of "
            f"waiting for {said}: wait longer (timeout=...), or see get_job({name!r}).status "
            "and get_job_logs",
            job,
        )

    def _ended(self, job: DDPTrainingJob, said: str) -> JobEndedError:
        status = job.status or JobStatus()
        where = f"job {job.name} in namespace {self.namespace}"
        if status.phase != "Failed":
            return JobEndedError(
                job.name,
                self.namespace,
                f"{where} {status.phase} while waiting for {said}: it ended before, and stays so",
                job,
            )
        failed = next((c for c in status.conditions if c.type == "Failed"), None)
        why = f" ({failed.reason}: {failed.message})" if failed else ""
        return JobFailedError(
            job.name,
            self.namespace,
            f"{where} Failed{why} while waiting for {said}: get_job({job.name!r}).status.failure "
            f"names the worker, get_job_logs({job.name!r}) shows its log while its pod exists",
            job,
        )

    # --- logs --------------------------------------------------------------------------------

    def get_job_logs(self, name: str, worker: int = 0, follow: bool = False) -> Iterator[str]:
        """The trainer container's log of one worker of the job's current attempt (worker 0's
        by default: rank 0 prints the progress), line by line; `follow`: until the container
        ends."""
        pod = self._worker_pod(name, worker)
        query = {"container": names.TRAINER_CONTAINER, **({"follow": "true"} if follow else {})}
        pods_path = collection_path("v1", "Pod", self.namespace)
        path = f"{pods_path}/{names.path_segment(pod)}/log?{urlencode(query)}"
        return self._log_lines(path, f"worker {worker} of job {name} (pod {pod})", name)

    def _log_lines(self, path: str, whose: str, job: str) -> Iterator[str]:
        lines = self._kube.lines(path)
        try:
            while (line := self._run(_next_line(lines))) is not None:
                yield line
        except (NotFoundError, BadRequestError) as error:  # 400: a container not started
            raise LogsUnavailableError(
                job,
                self.namespace,
                f"no log of {whose}: {error.message}; a pod has one once its container "
                "started, until the pod is removed",
            ) from None
        finally:
            # Ended, failed, or abandoned by its reader; a read cancelled by an interrupt may
            # still be closing it ("already running"), and closes it itself.
            with contextlib.suppress(RuntimeError):
                self._run(lines.aclose())

    def _worker_pod(self, name: str, worker: int) -> str:
        selector = urlencode({"labelSelector": f"{names.LABEL_JOB_NAME}={name}"})
        pods_path = collection_path("v1", "Pod", self.namespace)
        listing = self._run(self._kube.request("GET", f"{pods_path}?{selector}"))
        current = clusterview.latest_attempt(listing.get("items", []))
        if not current:
            self.get_job(name)  # JobNotFoundError where it is the job that is missing
            raise LogsUnavailableError(
                name,
                self.namespace,
                f"job {name} has no worker pods now: pending, suspended, or its pods were "
                f"removed at its end (cleanPodPolicy); get_job({name!r}).status says which",
            )
        for pod in current:
            if clusterview.worker_index(pod) == worker:
                return str(pod["metadata"]["name"])
        raise LogsUnavailableError(
            name,
            self.namespace,
            f"job {name} has no worker {worker} now (its workers: 0 to {len(current) - 1} of "
            f"attempt {clusterview.attempt_of(current[0])})",
        )


async def _next_line(lines: AsyncGenerator[str]) -> str | None:
    """The next line, None at the end (a StopAsyncIteration cannot cross into the caller's
    thread)."""
    return await anext(lines, None)
