"""A stand-in for the one API call the trainer makes: the merge patch of `status.training`.

Rank 0 of the trainer reports progress with `ddp_trainer.report`, which PATCHes its job's
/status subresource with a bearer token. Locally, this small server on 127.0.0.1 accepts that
request at the same path, so the trainer is pointed at it (KUBEDDP_API_SERVER, and a token file
for KUBEDDP_TOKEN_FILE) and cannot tell it from the API server.
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
from kube_ddp.api import DDPTrainingJob, TrainingProgress


def status_path(job: DDPTrainingJob) -> str:
    quote = urllib.parse.quote
    return (
        f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{quote(job.namespace)}"
        f"/{names.PLURAL}/{quote(job.name)}/status"
    )


class StatusEndpoint(ThreadingHTTPServer):
    """Accepts merge patches of `status.training` for one job; `on_report` is called after each."""

    daemon_threads = True

    def __init__(self, job: DDPTrainingJob, token_dir: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.patch_path = status_path(job)
        self.token = secrets.token_urlsafe(24)
        self.token_file = token_dir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.lock = threading.Lock()
        self.training: dict[str, Any] = {}
        self.reports = 0
        self.on_report: Callable[[], None] = lambda: None
        self._thread = threading.Thread(target=self.serve_forever, name="status-endpoint")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def progress(self) -> TrainingProgress | None:
        with self.lock:
            return TrainingProgress.model_validate(self.training) if self.training else None

    def checkpoint_step(self) -> int | None:
        """The global step of the newest checkpoint rank 0 reported saved, if any."""
        with self.lock:
            saved = self.training.get("checkpoint")
        step = saved.get("step") if isinstance(saved, dict) else None
        return step if isinstance(step, int) else None

    def merge(self, patch: Any) -> str | None:
        """Apply a JSON merge patch to status.training; a problem in words, or None."""
        status = patch.get("status") if isinstance(patch, dict) else None
        if not isinstance(status, dict) or set(status) != {"training"}:
            return "only status.training may be patched"
        training = status["training"]
        if not isinstance(training, dict):
            return "status.training must be an object"
        with self.lock:
            merged = {**self.training, **training}
            merged = {key: value for key, value in merged.items() if value is not None}
            try:
                TrainingProgress.model_validate(merged)
            except ValidationError as error:
                return str(error)
            self.training = merged
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
            payload = json.dumps({"status": {"training": self.server.training}}).encode()
        else:
            payload = json.dumps({"kind": "Status", "code": code, "message": message}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the runner shows progress itself
