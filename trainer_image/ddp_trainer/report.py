"""Training progress to the cluster: rank 0 merge-patches `status.training` of its job.

Only the standard library (urllib, ssl): the trainer image needs no Kubernetes client. The
pod's service account must be allowed to `patch` `ddptrainingjobs/status` in group kubeddp.io.

Environment (the operator sets the job's name and namespace, the next three empty so that no
envFrom source can redirect the token, and KUBEDDP_REPORT; `kube-ddp run --local` and the
tests point the three at a local API server):

  KUBEDDP_JOB_NAME, KUBEDDP_JOB_NAMESPACE   which DDPTrainingJob to patch
  KUBEDDP_API_SERVER   base URL, https or a loopback http://;
                       default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
  KUBEDDP_TOKEN_FILE   bearer token, re-read each time (tokens rotate);
                       default /var/run/secrets/kubernetes.io/serviceaccount/token
  KUBEDDP_CA_FILE      CA bundle for https; default .../serviceaccount/ca.crt
  KUBEDDP_REPORT       "false" where the pods' account may not report: nothing is sent

A failed report logs a warning and backs off (5 s, doubling up to 5 min; the last epoch's
report is tried regardless); it never raises, so it never stops training.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, SupportsFloat

from ddp_trainer import contract

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0
REQUEST_TIMEOUT_S = 5.0


def training_patch(
    *,
    epoch: int,
    epochs: int,
    loss: float,
    val_accuracy: float,
    best_val_accuracy: float,
    images_per_sec: float,
    now: datetime,
    val_loss: float | None = None,
) -> dict[str, Any]:
    """The JSON merge patch that sets status.training (the operator's TrainingProgress)."""
    training: dict[str, Any] = {
        "epoch": epoch,
        "epochs": epochs,
        "loss": finite(loss, 6),
        "valAccuracy": finite(val_accuracy, 6),
        "bestValAccuracy": finite(best_val_accuracy, 6),
        "imagesPerSec": finite(images_per_sec, 1),
        "updatedAt": stamp(now),
    }
    if val_loss is not None:
        training["valLoss"] = finite(val_loss, 6)
    return {"status": {"training": training}}


def checkpoint_fields(
    *, step: int, epoch: int, saved_at: datetime, seconds: float, resumed_from_step: int
) -> dict[str, Any]:
    """status.training's `checkpoint` (the newest completed save: its global step, epoch, time
    and how long it took) and `resumedFromStep` (where this attempt started; 0 for a fresh
    start)."""
    return {
        "checkpoint": {
            "step": step,
            "epoch": epoch,
            "savedAt": stamp(saved_at),
            "saveSeconds": round(seconds, 3),
        },
        "resumedFromStep": resumed_from_step,
    }


def position_fields(
    *, epoch: int, epochs: int, step: int, steps_per_epoch: int, remaining_seconds: float | None
) -> dict[str, Any]:
    """Where training stands (`epoch` epochs done, `step` steps into the next), in Kubeflow
    Trainer's words where it has them (progressPercentage, estimatedRemainingSeconds)."""
    total = epochs * steps_per_epoch
    done = epoch * steps_per_epoch + step
    fields: dict[str, Any] = {
        "epoch": epoch,
        "epochs": epochs,
        "step": step,
        "stepsPerEpoch": steps_per_epoch,
        "progressPercentage": min(100, done * 100 // total) if total else None,
    }
    if remaining_seconds is not None and remaining_seconds <= contract.MAX_SECONDS:
        fields["estimatedRemainingSeconds"] = max(0, round(remaining_seconds))
    return fields


class Heartbeat:
    """Rank 0's progress within an epoch, sent at most once per `every` seconds: frequent
    enough for runPolicy.progressDeadlineSeconds to tell a hung group from a long epoch, one
    small PATCH per interval (2 a minute at the default 30 s)."""

    def __init__(
        self,
        reporter: StatusReporter,
        *,
        epochs: int,
        steps_per_epoch: int,
        world_size: int = 1,
        every: float = contract.HEARTBEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reporter = reporter
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.world_size = world_size  # the ranks training now: status.training.worldSize
        self.every = every
        self.clock = clock
        self.started = clock()
        self.last = -math.inf  # the first step reports: the deadline counts from there
        self.first_step: int | None = None  # the global step this process started at
        # The longest time between two reports of this process, and the epochs it reported:
        # the operator's progress deadline is learned from it once an epoch (its validation
        # and checkpoint included) has ended.
        self.longest_gap = 0.0
        self.epoch_ends = 0

    @classmethod
    def every_from_env(cls, env: Mapping[str, str]) -> float:
        value = env.get(contract.HEARTBEAT_ENV)
        return float(value) if value else float(contract.HEARTBEAT_SECONDS)

    def position(self, epoch: int, step: int) -> dict[str, Any]:
        """The progress fields after `epoch` epochs and `step` steps of the next, with the
        time left at this process's speed so far."""
        done = epoch * self.steps_per_epoch + step
        steps, seconds = done - (self.first_step or 0), self.clock() - self.started
        left = self.epochs * self.steps_per_epoch - done
        remaining = left * seconds / steps if steps > 0 else None
        fields = position_fields(
            epoch=epoch,
            epochs=self.epochs,
            step=step,
            steps_per_epoch=self.steps_per_epoch,
            remaining_seconds=remaining,
        )
        fields["worldSize"] = self.world_size
        if self.epoch_ends:
            fields["longestReportGapSeconds"] = round(self.longest_gap, 1)
        return fields

    def beat(self, epoch: int, step: int, loss: SupportsFloat | None = None) -> bool:
        """Report `step` steps into the epoch after `epoch` if a heartbeat is due. `loss` is
        read (`float`, a device sync for a tensor) only then."""
        if self.first_step is None:
            self.first_step = epoch * self.steps_per_epoch + step - 1
        if self.clock() - self.last < self.every:
            return False
        return self.send(epoch, step, loss)

    def send(
        self, epoch: int, step: int, loss: SupportsFloat | None = None, final: bool = False
    ) -> bool:
        """Report `step` steps into the epoch after `epoch` now (step 0: the epoch's end); the
        next heartbeat is due an interval later."""
        self._mark(epoch_end=step == 0)
        training = {**self.position(epoch, step), "updatedAt": stamp(now_utc())}
        if loss is not None:
            training["loss"] = finite(as_number(loss), 6)
        return self.reporter.report({"status": {"training": training}}, final=final)

    def epoch_report(self, epoch: int) -> dict[str, Any]:
        """The progress fields of the report of epoch `epoch`'s end, about to go out: the next
        heartbeat is due an interval later."""
        self._mark(epoch_end=True)
        return self.position(epoch, 0)

    def report_stall(self, fields: Mapping[str, Any]) -> bool:
        """Say what rank 0 found when the group stalled (`culprit.Ledger.watch`). Sent from
        the ledger's thread: the main thread may be blocked in a collective."""
        stall = {**fields, "checkedAt": stamp(now_utc())}
        return self.reporter.report({"status": {"training": {"stall": stall}}})

    def report_straggler(self, fields: Mapping[str, Any] | None) -> bool:
        """Say which rank the group waits for at every step (`culprit.Ledger.watch`), or that
        none does any more (null removes it)."""
        straggler = None if fields is None else {**fields, "checkedAt": stamp(now_utc())}
        return self.reporter.report({"status": {"training": {"straggler": straggler}}})

    def _mark(self, epoch_end: bool) -> None:
        now = self.clock()
        if self.last > -math.inf:
            self.longest_gap = max(self.longest_gap, now - self.last)
        self.last = now
        self.epoch_ends += epoch_end


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_number(value: SupportsFloat) -> float:
    """A float, or a tensor's value read without its graph: a loss straight from the step
    (requires_grad) reads as a number, with no warning."""
    detach = getattr(value, "detach", None)
    return float(value if detach is None else detach())


def finite(value: float, digits: int) -> float | None:
    """JSON has no NaN, and the CRD no number past contract.MAX_METRIC: a diverged loss is
    reported as null."""
    return round(value, digits) if abs(value) <= contract.MAX_METRIC else None


def status_url(api_server: str, namespace: str, name: str) -> str:
    quoted = urllib.parse.quote
    return (
        f"{api_server.rstrip('/')}/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{quoted(namespace)}"
        f"/{contract.API_PLURAL}/{quoted(name)}/status"
    )


class StatusReporter:
    """PATCHes a job's /status subresource; after a failure, skips reports for a while."""

    def __init__(
        self,
        url: str,
        token_file: Path,
        ca_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        attempt: int | None = None,
    ) -> None:
        self.url = url
        self.token_file = token_file
        # stamped on each status.training sent: a report of an attempt not the job's current
        # one (a rank of a group cut off from the cluster) is refused or ignored
        self.attempt = attempt
        self.clock = clock
        self.ssl_context = ssl.create_default_context(
            cafile=str(ca_file) if ca_file and ca_file.is_file() else None
        )
        self.backoff_s = 0.0
        self.retry_at = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StatusReporter | None:
        """A reporter when run by the operator with a service-account token, else None."""
        name, namespace = env.get(contract.JOB_NAME), env.get(contract.JOB_NAMESPACE)
        if not (name and namespace):
            return None
        if env.get(contract.REPORT_ENV) == "false":
            log.info(
                "not reporting progress: the pods' ServiceAccount may not report on the job "
                "(template.serviceAccountReports)"
            )
            return None
        api_server = env.get(contract.API_SERVER_ENV) or _in_cluster_api_server(env)
        if api_server and not _may_carry_token(api_server):
            log.warning(
                "not reporting progress to %s: the token goes over https only, or to this "
                "machine (loopback)",
                api_server,
            )
            return None
        token_file = Path(env.get(contract.TOKEN_FILE_ENV) or SERVICE_ACCOUNT_DIR / "token")
        if not api_server or not token_file.is_file():
            log.info("not reporting progress: no API server address or no token at %s", token_file)
            return None
        ca_file = Path(env.get(contract.CA_FILE_ENV) or SERVICE_ACCOUNT_DIR / "ca.crt")
        attempt = env.get(contract.ATTEMPT, "")
        return cls(
            status_url(api_server, namespace, name),
            token_file,
            ca_file,
            attempt=int(attempt) if attempt.isdigit() else None,
        )

    def report(self, patch: dict[str, Any], final: bool = False) -> bool:
        """Send the patch unless backing off (the final one is always tried); True when the
        API server accepted it."""
        if self.clock() < self.retry_at and not final:
            return False
        try:
            self._send(patch)
        except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
            self.backoff_s = min(max(self.backoff_s * 2, FIRST_BACKOFF_S), MAX_BACKOFF_S)
            self.retry_at = self.clock() + self.backoff_s
            log.warning(
                "could not report progress to %s: %s; next try in %.0f s",
                self.url,
                _describe(exc),
                self.backoff_s,
            )
            return False
        self.backoff_s = self.retry_at = 0.0
        return True

    def _send(self, patch: dict[str, Any]) -> None:
        training = patch.get("status", {}).get("training")
        if isinstance(training, dict) and self.attempt is not None:
            patch = {
                **patch,
                "status": {**patch["status"], "training": {**training, "attempt": self.attempt}},
            }
        token = self.token_file.read_text().strip()
        request = urllib.request.Request(
            self.url,
            data=json.dumps(patch).encode(),
            method="PATCH",
            headers={
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
                "Authorization": f"Bearer {token}",
            },
        )
        context = self.ssl_context if self.url.startswith("https:") else None
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S, context=context):
            pass


def _may_carry_token(url: str) -> bool:
    """Whether a bearer token may go to `url`: https, or plain http to loopback only."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return True
    if parts.scheme != "http":
        return False
    try:
        return ipaddress.ip_address(parts.hostname or "").is_loopback
    except ValueError:
        return parts.hostname == "localhost"


def _in_cluster_api_server(env: Mapping[str, str]) -> str | None:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not (host and port):
        return None
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    return f"https://{host}:{port}"


def _describe(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        body = exc.read(300).decode(errors="replace").strip()
        return f"HTTP {exc.code} {exc.reason}" + (f": {body}" if body else "")
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)


def now_utc() -> datetime:
    return datetime.now(UTC)
