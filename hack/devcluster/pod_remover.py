"""The last step of a kubelet, for kwok's nodes: a pod being deleted is removed from the API by
its uid once its (simulated) containers stopped, which for kwok is at once.

kwok v0.8.0's own pod-delete stage deletes by name with no uid precondition, and plays once per
event of a pod being deleted: a play left over from one pod removed the next pod of that name
(an operator's new attempt, created under the same name a moment later). A kubelet never does:
it deletes the pod it ran. `up` starts this as a component of its own (no import of the
devcluster package: it runs as a script), and kwok runs without the pod-delete stage.

    python pod_remover.py SERVER PKI_DIR

Pods a stopped kubelet holds (`KUBELET_STOPPED`) are left alone, as are pods on nodes kwok does
not manage (the real node's). It lists, then watches, and lists again whenever the watch ends
(an API server restart)."""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The nodes kwok manages (its --manage-nodes-with-annotation-selector).
KWOK_NODE = {"kwok.x-k8s.io/node": "fake"}
# A pod annotated so is on a kubelet that stopped (a test's silent node): kwok disregards it and
# this leaves it as it is, Terminating, as a node that stopped reporting leaves its pods.
KUBELET_STOPPED = {"sim.kubeddp.io/kubelet": "stopped"}
WATCH_SECONDS = 240


def annotated(obj: dict[str, Any], wanted: dict[str, str]) -> bool:
    annotations = obj.get("metadata", {}).get("annotations") or {}
    return all(annotations.get(key) == value for key, value in wanted.items())


class Api:
    """One keep-alive HTTPS connection to the API server, made again after an error."""

    def __init__(self, server: str, pki: Path) -> None:
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(pki / "kwok.crt", pki / "kwok.key")
        self.connection: http.client.HTTPSConnection | None = None

    def connect(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        if self.connection is None:
            self.connection = self.connect(timeout=10)
        try:
            payload = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if payload else {}
            self.connection.request(method, path, body=payload, headers=headers)
            response = self.connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self.connection.close()
            self.connection = None
            raise
        return response.status, json.loads(data) if data else None

    def watch(self, path: str) -> Iterator[dict[str, Any]]:
        """The events of one watch, until the server ends it."""
        connection = self.connect(timeout=WATCH_SECONDS + 30)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            if response.status != 200:
                raise http.client.HTTPException(f"watch {path}: HTTP {response.status}")
            for line in response:
                if line.strip():
                    yield json.loads(line)
        finally:
            connection.close()


class Remover:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.removed: set[str] = set()  # uids

    def kwok_manages(self, node: str) -> bool:
        """Looked up each time: a test silences a node by taking kwok's annotation away."""
        status, body = self.api.call("GET", f"/api/v1/nodes/{urllib.parse.quote(node)}")
        return status == 200 and annotated(body, KWOK_NODE)

    def offer(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        node = pod.get("spec", {}).get("nodeName")
        if (
            not metadata.get("deletionTimestamp")
            or not node
            or metadata["uid"] in self.removed
            or annotated(pod, KUBELET_STOPPED)
            or not self.kwok_manages(node)
        ):
            return
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}"
        options = {"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}}
        status, body = self.api.call("DELETE", path, options)
        # 404: gone already; 409: the name is another pod's now. Neither is ours to remove.
        if status in (200, 202, 404, 409):
            self.removed.add(metadata["uid"])
            print(f"removed {metadata['namespace']}/{metadata['name']} ({status})", flush=True)
        else:
            print(f"delete {path}: HTTP {status}: {body}", flush=True)

    def list_then_watch(self) -> None:
        status, listed = self.api.call("GET", "/api/v1/pods")
        if status != 200:
            raise http.client.HTTPException(f"list pods: HTTP {status}")
        for pod in listed["items"]:
            self.offer(pod)
        version = listed["metadata"]["resourceVersion"]
        self.removed.intersection_update(p["metadata"]["uid"] for p in listed["items"])
        print(f"watching pods from resourceVersion {version}", flush=True)
        while True:
            query = urllib.parse.urlencode(
                {
                    "watch": "true",
                    "resourceVersion": version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": WATCH_SECONDS,
                }
            )
            for event in self.api.watch(f"/api/v1/pods?{query}"):
                if event["type"] == "ERROR":  # 410 Gone: too old to resume; list again
                    return
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.offer(event["object"])
                elif event["type"] == "DELETED":
                    self.removed.discard(event["object"]["metadata"]["uid"])


def main() -> None:
    server, pki = sys.argv[1], Path(sys.argv[2])
    remover = Remover(Api(server, pki))
    while True:
        try:
            remover.list_then_watch()
        except (OSError, http.client.HTTPException, ValueError) as error:
            print(f"list/watch ended ({error!r}); again in 0.5 s", flush=True)
            time.sleep(0.5)


if __name__ == "__main__":
    main()
