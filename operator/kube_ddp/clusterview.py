"""`kube-ddp logs` and `kube-ddp describe`: a job's workers and state on one screen.

Thin, over kubectl itself: every read is a `kubectl get` or `kubectl logs` with the user's own
--kubeconfig, --context and -n (or KUBECONFIG and the context's namespace), so credentials,
exec plugins and contexts work exactly as they do for kubectl. The same commands ship as the
kubectl plugin `kubectl ddp`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from kube_ddp import names, plot
from kube_ddp.api import JobStatus, Obj
from kube_ddp.terminal import printable, printable_line

KUBECTL_TIMEOUT_S = 60
EVENTS_SHOWN = 12


class ClusterError(Exception):
    """kubectl could not answer (no such job, no access, no cluster): its own words."""


@dataclass(frozen=True)
class Kubectl:
    """kubectl with the connection flags the user gave."""

    binary: str
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None

    def args(self, *args: str) -> list[str]:
        flags = [
            f"--kubeconfig={self.kubeconfig}" if self.kubeconfig else "",
            f"--context={self.context}" if self.context else "",
            f"--namespace={self.namespace}" if self.namespace else "",
        ]
        return [self.binary, *(flag for flag in flags if flag), *args]

    def json(self, *args: str) -> Obj:
        done = subprocess.run(
            self.args(*args, "--output=json"),
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise ClusterError(done.stderr.strip() or f"kubectl exited {done.returncode}")
        result: Obj = json.loads(done.stdout)
        return result


def find_kubectl(given: str | None) -> str:
    binary = given or os.environ.get("KUBECTL") or "kubectl"
    found = shutil.which(binary)
    if found is None:
        raise ClusterError(f"{binary} not found: install kubectl, or pass --kubectl PATH")
    return found


# --- reading -------------------------------------------------------------------------------


def get_job(kubectl: Kubectl, name: str) -> Obj:
    return kubectl.json("get", f"{names.PLURAL}.{names.GROUP}", name)


def get_workers(kubectl: Kubectl, job: str) -> list[Obj]:
    """The job's worker pods, by index, then attempt."""
    listing = kubectl.json("get", "pods", f"--selector={names.LABEL_JOB_NAME}={job}")
    return sorted(listing.get("items", []), key=lambda pod: (worker_index(pod), attempt_of(pod)))


def get_events(kubectl: Kubectl, involved: set[str]) -> list[Obj]:
    """Events about the job and its pods, oldest first."""
    listing = kubectl.json("get", "events")
    events = [
        event
        for event in listing.get("items", [])
        if event.get("involvedObject", {}).get("name") in involved
    ]
    return sorted(events, key=_event_time)


def _label(pod: Obj, key: str) -> str:
    return str(pod.get("metadata", {}).get("labels", {}).get(key, ""))


def worker_index(pod: Obj) -> int:
    value = _label(pod, names.LABEL_REPLICA_INDEX)
    return int(value) if value.isdigit() else -1


def attempt_of(pod: Obj) -> int:
    value = _label(pod, names.LABEL_ATTEMPT)
    return int(value) if value.isdigit() else -1


def latest_attempt(pods: Sequence[Obj]) -> list[Obj]:
    """The pods of the newest attempt among a job's worker pods (none of none)."""
    latest = max((attempt_of(pod) for pod in pods), default=-1)
    return [pod for pod in pods if attempt_of(pod) == latest]


def _event_time(event: Obj) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or event.get("metadata", {}).get("creationTimestamp")
        or ""
    )


# --- describe ------------------------------------------------------------------------------


def describe(job: Obj, pods: Sequence[Obj], events: Sequence[Obj], now: datetime) -> str:
    """The job on one screen: phase, conditions, the failure, training, pods, recent Events."""
    metadata, spec = job.get("metadata", {}), job.get("spec", {})
    try:
        status = JobStatus.model_validate(job.get("status") or {})
    except ValidationError:
        status = JobStatus()
    accelerator = spec.get("accelerator", {})
    per_node = accelerator.get("perNode")
    restarts = f"{status.restarts} of at most {spec.get('runPolicy', {}).get('backoffLimit', 3)}"
    if status.attempt:  # a group restarted: its pods' attempt
        restarts += f" (attempt {status.attempt})"
    workers = status.workers
    lines = [
        f"Name:         {metadata.get('name')}",
        f"Namespace:    {metadata.get('namespace')}",
        f"Phase:        {status.phase or '-'}",
        f"Restarts:     {restarts}",
        "Workers:      "
        + (
            f"{workers.total} ({workers.running} running, {workers.pending} pending, "
            f"{workers.succeeded} succeeded, {workers.failed} failed)"
            if workers
            else f"{spec.get('nodes')}"
        ),
        f"Accelerator:  {accelerator.get('type', 'cpu')}"
        + (f" x {per_node} per node" if per_node else "")
        + f", backend {spec.get('backend', 'auto')}",
        f"Started:      {_when(status.start_time, now)}",
        f"Completed:    {_when(status.completion_time, now)}",
    ]
    training = status.training
    if training and training.epoch is not None:
        parts = [f"epoch {training.epoch}/{training.epochs or '?'}"]
        if training.loss is not None:
            parts.append(f"loss {training.loss:.4f}")
        if training.val_accuracy is not None:
            best = training.best_val_accuracy
            parts.append(
                f"val-acc {training.val_accuracy:.4f}"
                + (f" (best {best:.4f})" if best is not None else "")
            )
        if training.images_per_sec is not None:
            parts.append(f"images/s {training.images_per_sec:.0f}")
        if training.world_size is not None:  # an elastic job short of a worker trains on fewer
            parts.append(f"{training.world_size} ranks")
        parts.append(f"reported {_when(training.updated_at, now)}")
        lines.append("Training:     " + "  ".join(parts))
    else:
        lines.append("Training:     no progress reported yet")
    if status.failure is not None:
        failure = status.failure
        code = f" exit {failure.exit_code}" if failure.exit_code is not None else ""
        detail = f": {failure.message}" if failure.message else ""
        lines.append(f"Failure:      {failure.pod}{code} ({failure.reason}){detail}")
    lines += ["", "Conditions:"]
    lines += _table(
        ("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"),
        [
            (c.type, c.status, c.reason or "", _age(c.last_transition_time, now), c.message or "")
            for c in status.conditions
        ],
    )
    lines += ["", "Pods:"]
    lines += _table(
        ("NAME", "PHASE", "ATTEMPT", "NODE", "EXIT", "REASON", "AGE"),
        [_pod_row(pod, now) for pod in pods],
    )
    recent = list(events)[-EVENTS_SHOWN:]
    lines += ["", f"Events (last {len(recent)}):" if recent else "Events:"]
    lines += _table(
        ("LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"),
        [
            (
                _age(_parse_time(_event_time(event)), now),
                event.get("type", ""),
                event.get("reason", ""),
                f"{event.get('involvedObject', {}).get('kind', '').lower()}/"
                f"{event.get('involvedObject', {}).get('name', '')}",
                " ".join(str(event.get("message", "")).split()),
            )
            for event in recent
        ],
    )
    return "\n".join(lines) + "\n"


def _pod_row(pod: Obj, now: datetime) -> tuple[str, ...]:
    status = pod.get("status", {})
    containers = status.get("containerStatuses") or [{}]
    trainer = next(
        (c for c in containers if c.get("name") == names.TRAINER_CONTAINER), containers[0]
    )
    state = trainer.get("state", {})
    terminated = state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    exit_code = terminated.get("exitCode")
    phase = status.get("phase", "Pending")
    if pod.get("metadata", {}).get("deletionTimestamp"):
        phase += " (deleting)"
    return (
        pod.get("metadata", {}).get("name", ""),
        phase,
        str(attempt_of(pod)),
        pod.get("spec", {}).get("nodeName") or "-",
        "-" if exit_code is None else str(exit_code),
        status.get("reason") or terminated.get("reason") or waiting.get("reason") or "-",
        _age(_parse_time(pod.get("metadata", {}).get("creationTimestamp")), now),
    )


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    rows = list(rows)
    if not rows:
        return ["  <none>"]
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    return [
        "  " + "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in table
    ]


def _parse_time(text: Any) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    return f"{moment.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} ({_age(moment, now)} ago)"


# --- logs ----------------------------------------------------------------------------------


def stream_logs(
    kubectl: Kubectl, pods: Sequence[Obj], follow: bool, out: TextIO, err: TextIO
) -> int:
    """Each pod's trainer log, lines prefixed `[worker-i]`: merged by time (each line's
    kubectl timestamp), or as they come with `follow`. 1 when some pod had no logs."""
    lock = threading.Lock()
    failures: list[str] = []
    collected: list[tuple[str, str]] = []

    def read(pod: Obj) -> None:
        name = pod["metadata"]["name"]
        prefix = f"[worker-{worker_index(pod)}]"
        command = kubectl.args(
            "logs", name, f"--container={names.TRAINER_CONTAINER}", "--timestamps"
        )
        if follow:
            command.append("--follow")
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stderr is not None
        for line in process.stdout:
            stamp, _, text = line.rstrip("\n").partition(" ")
            with lock:
                text = printable_line(text)
                if follow:
                    out.write(f"{prefix} {text}\n")
                    out.flush()
                else:
                    collected.append((stamp, f"{prefix} {text}"))
        problem = process.stderr.read().strip()
        if process.wait() != 0:
            with lock:
                failures.append(f"{prefix} no logs from {name}: {problem or 'kubectl failed'}")

    threads = [threading.Thread(target=read, args=(pod,), daemon=True) for pod in pods]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        return 130  # kubectl children get the same Ctrl-C from the terminal
    for _, line in sorted(collected, key=lambda item: sortable_timestamp(item[0])):
        out.write(line + "\n")
    for failure in sorted(failures):
        err.write(failure + "\n")
    return 1 if failures else 0


def sortable_timestamp(stamp: str) -> str:
    """kubectl's RFC 3339 timestamp with its fraction padded to nanoseconds: the kubelet drops
    trailing zeros (`.5Z`, `.51Z`), which would otherwise sort `.5` after `.51`."""
    whole, _, fraction = stamp.removesuffix("Z").partition(".")
    return f"{whole}.{fraction.ljust(9, '0')}"


# --- the subcommands ---------------------------------------------------------------------


def add_parsers(commands: Any) -> None:
    logs = commands.add_parser(
        "logs",
        help="the workers' logs of a job on the cluster, each line prefixed [worker-i]",
    )
    logs.add_argument("job", help="the DDPTrainingJob's name")
    logs.add_argument("--worker", type=int, metavar="I", help="only worker I")
    logs.add_argument("-f", "--follow", action="store_true", help="stream new lines")
    _connection_flags(logs)
    logs.set_defaults(run=cmd_logs)

    describe_parser = commands.add_parser(
        "describe",
        help="a job on the cluster: phase, conditions, failure, progress, pods, Events and "
        "the training curve",
    )
    describe_parser.add_argument("job", help="the DDPTrainingJob's name")
    describe_parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="also write the training curve to FILE.png"
    )
    _connection_flags(describe_parser)
    describe_parser.set_defaults(run=cmd_describe)


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube)")
    parser.add_argument("--kubectl", help="kubectl binary (default: $KUBECTL, then kubectl)")


def _kubectl(args: argparse.Namespace) -> Kubectl:
    return Kubectl(find_kubectl(args.kubectl), args.kubeconfig, args.context, args.namespace)


def cmd_describe(args: argparse.Namespace) -> int:
    try:
        kubectl = _kubectl(args)
        job = get_job(kubectl, args.job)
        pods = get_workers(kubectl, args.job)
        involved = {args.job, *(pod["metadata"]["name"] for pod in pods)}
        events = get_events(kubectl, involved)
    except ClusterError as error:
        print(error, file=sys.stderr)
        return 1
    sys.stdout.write(printable(describe(job, pods, events, datetime.now(UTC))))
    return write_curve(job, args.plot, sys.stdout, sys.stderr)


def write_curve(job: Obj, png_path: Path | None, out: TextIO, err: TextIO) -> int:
    """describe's end: the job's training curve (`status.trainingHistory`), drawn for a
    terminal, and written to `png_path` when given; 1 when that cannot be."""
    try:
        history = JobStatus.model_validate(job.get("status") or {}).training_history
    except ValidationError:
        history = None
    metadata = job.get("metadata", {})
    title = f"{metadata.get('namespace')}/{metadata.get('name')}"
    return plot.show(history, title, out, err, png_path)


def cmd_logs(args: argparse.Namespace) -> int:
    try:
        kubectl = _kubectl(args)
        pods = get_workers(kubectl, args.job)
    except ClusterError as error:
        print(error, file=sys.stderr)
        return 1
    if not pods:
        where = f" in namespace {args.namespace}" if args.namespace else ""
        print(
            f"no worker pods of job {args.job}{where}: it may not exist, be pending or "
            "suspended, or its pods were removed (cleanPodPolicy) - see kube-ddp describe",
            file=sys.stderr,
        )
        return 1
    chosen = latest_attempt(pods)
    if args.worker is not None:
        chosen = [pod for pod in chosen if worker_index(pod) == args.worker]
        if not chosen:
            print(f"job {args.job} has no worker {args.worker}", file=sys.stderr)
            return 1
    return stream_logs(kubectl, chosen, args.follow, sys.stdout, sys.stderr)
