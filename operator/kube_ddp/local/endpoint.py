"""A stand-in for the one API call the workers make: the merge patch of `status.training` (rank
0's progress) or `status.rankRestart` (a pod's agent that restarted its ranks in place).

Rank 0 of the trainer reports progress with `ddp_trainer.report`, which PATCHes its job's
/status subresource with a bearer token (the agent's report goes the same way). Locally, this
small server on 127.0.0.1 accepts that request at the same path, so the trainer is pointed at it
(KUBEDDP_API_SERVER, and a token file for KUBEDDP_TOKEN_FILE) and cannot tell it from the API
server.
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kube_ddp import names
from kube_ddp.api import DDPTrainingJob, EpochPoint, RankRestart, StatusModel, TrainingProgress
from kube_ddp.status.history import epoch_end

# The status fields the workers write, each with the model that checks it
WRITTEN_BY_WORKERS: dict[str, type[StatusModel]] = {
    "training": TrainingProgress,
    names.RANK_RESTART_FIELD: RankRestart,
}


def status_path(job: DDPTrainingJob) -> str:
    quote = urllib.parse.quote
    return (
        f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{quote(job.namespace)}"
        f"/{names.PLURAL}/{quote(job.name)}/status"
    )


class StatusEndpoint(ThreadingHTTPServer):
    """Accepts merge patches of the status fields the workers write (`WRITTEN_BY_WORKERS`) for
    one job; `on_report` is called after each."""

    daemon_threads = True

    def __init__(self, job: DDPTrainingJob, token_dir: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.patch_path = status_path(job)
        self.token = secrets.token_urlsafe(24)
        self.token_file = token_dir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.lock = threading.Lock()
        self.written: dict[str, dict[str, Any]] = {}
        self.reports = 0
        self._epoch_ends: list[EpochPoint] = []  # each report of an epoch's end, in turn
        self.on_report: Callable[[], None] = lambda: None
        self._thread = threading.Thread(target=self.serve_forever, name="status-endpoint")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def training(self) -> dict[str, Any]:
        with self.lock:
            return dict(self.written.get("training", {}))

    def progress(self) -> TrainingProgress | None:
        training = self.training
        return TrainingProgress.model_validate(training) if training else None

    def rank_restart(self) -> RankRestart | None:
        with self.lock:
            said = self.written.get(names.RANK_RESTART_FIELD)
        return RankRestart.model_validate(said) if said else None

    def take_epoch_ends(self) -> list[EpochPoint]:
        """The epoch ends reported since the last call: each is a point of the curve, even
        when the next report replaced it before the runner looked."""
        with self.lock:
            taken, self._epoch_ends = self._epoch_ends, []
        return taken

    def checkpoint_step(self) -> int | None:
        """The global step of the newest checkpoint rank 0 reported saved, if any."""
        saved = self.training.get("checkpoint")
        step = saved.get("step") if isinstance(saved, dict) else None
        return step if isinstance(step, int) else None

    def merge(self, patch: Any) -> str | None:
        """Apply a JSON merge patch to the fields the workers write; a problem in words, or
        None."""
        status = patch.get("status") if isinstance(patch, dict) else None
        allowed = ", ".join(f"status.{name}" for name in WRITTEN_BY_WORKERS)
        if not isinstance(status, dict) or not status or not set(status) <= set(WRITTEN_BY_WORKERS):
            return f"only {allowed} may be patched"
        if not all(isinstance(value, dict) for value in status.values()):
            return f"{allowed} must be objects"
        with self.lock:
            written = dict(self.written)
            for name, value in status.items():
                merged = {**written.get(name, {}), **value}
                merged = {key: each for key, each in merged.items() if each is not None}
                try:
                    model = WRITTEN_BY_WORKERS[name].model_validate(merged)
                except ValidationError as error:
                    return str(error)
                written[name] = merged
                point = epoch_end(model) if isinstance(model, TrainingProgress) else None
                if point is not None:
                    self._epoch_ends.append(point)
            self.written = written
            self.reports += 1
        self.on_report()
        return None

    def __enter__(self) -> StatusEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join()


class _Handler(BaseHTTPRequestHandler):
    server: StatusEndpoint

    def do_PATCH(self) -> None:
        if self.path != self.server.patch_path:
            self._answer(404, f"no such object: {self.path}")
            return
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._answer(401, "Unauthorized")
            return
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            self._answer(415, "expected application/merge-patch+json")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            patch = json.loads(body)
        except ValueError:
            self._answer(400, "the body is not JSON")
            return
        problem = self.server.merge(patch)
        if problem:
            self._answer(422, problem)
        else:
            self._answer(200, None)

    def _answer(self, code: int, message: str | None) -> None:
        if message is None:
            payload = json.dumps({"status": self.server.written}).encode()
        else:
            payload = json.dumps({"kind": "Status", "code": code, "message": message}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the runner shows progress itself
