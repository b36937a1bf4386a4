"""An API server in the test process, for the operator's shell (controller.py, kube.py).

It speaks HTTP on 127.0.0.1 (aiohttp's test server), records every request, and answers the
few calls the operator makes: POST creates (echoing the object, given a uid), DELETE deletes,
PATCH of a job's status merges into the job it holds and bumps its resourceVersion, PATCH of a
job merges into its spec, GET returns what a test put in `objects`. A test scripts other
answers (a 422, a 401, a 500) by method and path. This is no Kubernetes: what needs the real
API server's behaviour (schemas, RBAC, watches) is the cluster tier's.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web
from aiohttp.test_utils import TestServer

from kube_ddp.kube import Kube, job_path


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any
    authorization: str | None


@dataclass
class Answer:
    method: str
    path: re.Pattern[str]
    status: int
    body: dict[str, Any]
    times: int  # how many requests it answers; then the default behaviour returns


@dataclass
class FakeApi:
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by job path
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # other GETs, by path
    calls: list[Call] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    url: str = ""

    def put_job(self, body: dict[str, Any]) -> None:
        metadata = body["metadata"]
        self.jobs[job_path(metadata["namespace"], metadata["name"])] = copy.deepcopy(body)

    def answer(
        self,
        method: str,
        path: str,
        status: int,
        message: str = "scripted",
        times: int = 1,
    ) -> None:
        """The next `times` requests of `method` to a path matching `path` get `status`."""
        body = {"kind": "Status", "status": "Failure", "message": message, "code": status}
        self.answers.append(Answer(method, re.compile(path), status, body, times))

    def made(self, method: str, path: str = "") -> list[Call]:
        """The recorded calls of `method` whose path contains `path`."""
        return [c for c in self.calls if c.method == method and path in c.path]

    async def handle(self, request: web.Request) -> web.Response:
        text = await request.text()
        body = json.loads(text) if text else None
        call = Call(request.method, request.path, body, request.headers.get("Authorization"))
        self.calls.append(call)
        for answer in self.answers:
            if answer.times and answer.method == call.method and answer.path.search(call.path):
                answer.times -= 1
                return web.json_response(answer.body, status=answer.status)
        if call.method == "POST":  # echoed as created, with a uid of its name
            metadata = body.get("metadata") or {}
            uid = f"uid-of-{metadata.get('name') or metadata.get('generateName')}"
            return web.json_response({**body, "metadata": {"uid": uid, **metadata}}, status=201)
        if call.method == "DELETE":
            return web.json_response({"kind": "Status", "status": "Success"})
        if call.method == "PATCH" and call.path.endswith("/status"):
            return self._patch_status(call.path.removesuffix("/status"), body)
        if call.method == "PATCH" and call.path in self.jobs:
            job = self.jobs[call.path]
            job["spec"] = _merge(job["spec"], body.get("spec") or {})
            job["metadata"] = _merge(job["metadata"], body.get("metadata") or {})
            return web.json_response(job)
        if call.method == "GET" and call.path in self.objects:
            return web.json_response(self.objects[call.path])
        return web.json_response({"message": "not served by the fake"}, status=404)

    def _patch_status(self, path: str, patch: dict[str, Any]) -> web.Response:
        job = self.jobs.get(path)
        if job is None:
            return web.json_response({"message": "not found", "code": 404}, status=404)
        job["status"] = _merge(job.get("status") or {}, patch["status"])
        metadata = job["metadata"]
        metadata["resourceVersion"] = str(int(metadata.get("resourceVersion", "0")) + 1)
        return web.json_response(job)


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch (RFC 7386): null deletes, objects merge, the rest replaces."""
    merged = dict(into)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@asynccontextmanager
async def serving(api: FakeApi) -> AsyncIterator[FakeApi]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    api.url = str(server.make_url("")).rstrip("/")
    try:
        yield api
    finally:
        await server.close()


def kube_for(api: FakeApi, tokens: list[str] | None = None) -> Kube:
    """A Kube client of the fake; each (re-)authentication takes the next of `tokens`."""
    remaining = list(tokens or ["token-1"])

    def credentials() -> kopf.ConnectionInfo:
        token = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        return kopf.ConnectionInfo(server=api.url, token=token)

    return Kube(credentials)
