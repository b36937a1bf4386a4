"""The operator's few calls to the Kubernetes API, each idempotent, over aiohttp.

Creating what exists, or deleting what is gone, is success: reconciles repeat freely. The
credentials are kopf's own (its service-account and kubeconfig readers), so kopf's watches
and these calls authenticate alike, and no Kubernetes client library (and its thousand model
classes, most of an operator's memory) is loaded.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from urllib.parse import quote

import aiohttp
import kopf
import orjson
import yarl

from kube_ddp import gang, kueue, names
from kube_ddp.api import Obj

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# Where each kind we create lives: (apiVersion, kind) -> plural.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Event"): "events",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    (names.MPIJOB_API_VERSION, names.MPIJOB_KIND): names.MPIJOB_PLURAL,
    (names.NETWORK_POLICY_API_VERSION, names.NETWORK_POLICY_KIND): names.NETWORK_POLICY_PLURAL,
    (names.API_VERSION, names.KIND): names.PLURAL,
    **{(kind.api_version, kind.kind): kind.plural for kind in gang.KINDS.values()},
    (kueue.API_VERSION, kueue.WORKLOAD_KIND): kueue.WORKLOADS,
}


class ApiError(Exception):
    """A non-2xx answer: its HTTP status and the API server's message. `api_error` picks the
    subclass, so callers catch what they mean (NotFoundError, ConflictError) rather than numbers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class RefusedError(ApiError):
    """The API server's verdict on the object itself: sending it again cannot help."""


class BadRequestError(RefusedError):
    """400."""


class UnprocessableError(RefusedError):
    """422: the object breaks the schema or a validation rule."""


class UnauthorizedError(ApiError):
    """401: the credentials are not (or no longer) accepted."""


class ForbiddenError(ApiError):
    """403: RBAC does not allow it, or an admission plugin refuses the object (PodSecurity, a
    ResourceQuota, a LimitRange: `status.refusals` tells them apart)."""


class NameTakenError(Exception):
    """A child's name is held by an object this job does not control: `passing` where that
    one goes by itself (it is being deleted, or an earlier job of this name made it and the
    garbage collector takes it), else the user must free the name."""

    def __init__(self, obj: Obj, holder: Obj) -> None:
        metadata = holder.get("metadata", {})
        owner = _controller_of(holder)
        self.passing = metadata.get("deletionTimestamp") is not None or (
            owner is not None and owner.get("kind") == names.KIND
        )
        held_by = f"{owner.get('kind')} {owner.get('name')}" if owner else "no owner"
        what = f"{obj['kind']} {obj['metadata']['name']} exists and is not this job's ({held_by})"
        fix = "waiting for it to go" if self.passing else "delete it, or give the job another name"
        super().__init__(f"{what}: {fix}")


def _controller_of(obj: Obj) -> Obj | None:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


class NotFoundError(ApiError):
    """404: the object, or its kind, does not exist."""


class ConflictError(ApiError):
    """409: it exists already, or the resourceVersion is stale."""


_ERRORS_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableError,
}


def api_error(status: int, message: str) -> ApiError:
    return _ERRORS_BY_STATUS.get(status, ApiError)(status, message)


def load_credentials(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """$KUBECONFIG when set (--kubeconfig sets it), else the in-cluster service account, else
    ~/.kube/config; `kubeconfig`: that file's current context only."""
    settings = kopf.OperatorSettings()
    if kubeconfig is not None:
        with _kubeconfig_read_from(kubeconfig):
            info = kopf.login_with_kubeconfig(settings=settings)
        if info is None:
            raise kopf.LoginError(f"{kubeconfig}: no kubeconfig there")
        return info
    readers = [kopf.login_with_service_account, kopf.login_with_kubeconfig]
    if os.environ.get("KUBECONFIG"):
        readers.reverse()
    info = next((i for read in readers if (i := read(settings=settings)) is not None), None)
    if info is None:
        raise kopf.LoginError("no service account and no kubeconfig: pass --kubeconfig")
    return info


_ENVIRON = threading.Lock()


@contextlib.contextmanager
def _kubeconfig_read_from(path: str) -> Iterator[None]:
    """$KUBECONFIG set to `path` while kopf's reader, which reads only that, runs."""
    with _ENVIRON:
        before = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = path
        try:
            yield
        finally:
            if before is None:
                del os.environ["KUBECONFIG"]
            else:
                os.environ["KUBECONFIG"] = before


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{names.path_segment(namespace)}/{PLURALS[api_version, kind]}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{names.path_segment(name)}"


def request_url(server: str, path: str) -> yarl.URL:
    """The URL of `path` on `server`, the path's segments escaped already
    (`names.path_segment`): taken as it is, never normalised, so a segment's `%2E%2E` stays a
    name and is not resolved to the segment above."""
    return yarl.URL(server + path, encoded=True)


def job_path(namespace: str, name: str) -> str:
    return object_path(names.API_VERSION, names.KIND, namespace, name)


def workload_path(namespace: str, name: str) -> str:
    return object_path(kueue.API_VERSION, kueue.WORKLOAD_KIND, namespace, name)


# Connections to the API server at most, shared by every reconcile. Each open TLS connection
# keeps about 128 KiB of buffers; with 64, a burst of creates left 20-32 of them idle and the
# operator at 1,000 jobs held 97-99 MiB against 90-92 MiB with 16, whose bursts of 200 and
# 1,000 jobs ran about as fast (docs/BENCHMARKS.md, the operator's notes).
CONNECTIONS = 16


class Kube:
    """Idempotent verbs over one HTTP session."""

    def __init__(self, credentials: Callable[[], kopf.ConnectionInfo] = load_credentials) -> None:
        self._credentials = credentials
        self._session: aiohttp.ClientSession | None = None
        self._server = ""

    def _open(self) -> aiohttp.ClientSession:
        info = self._credentials()
        self._server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS, ssl=info.as_ssl_context()),
            headers={**info.as_http_headers(), "User-Agent": "kube-ddp"},
            timeout=aiohttp.ClientTimeout(total=30),
        )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        content_type: str | None = None,
    ) -> Obj:
        """One call; a 401 re-reads the credentials once (service-account tokens rotate)."""
        for attempt in (1, 2):
            session = self._session or self._open()
            headers = {"Content-Type": content_type or "application/json"}
            data = orjson.dumps(body) if body is not None else None
            async with session.request(
                method, request_url(self._server, path), data=data, headers=headers
            ) as response:
                raw = await response.read()
                if not 200 <= response.status <= 299:
                    error = _error_of(response, raw)
                    if isinstance(error, UnauthorizedError) and attempt == 1:
                        await session.close()
                        self._session = None
                        continue
                    raise error
                return dict(orjson.loads(raw)) if raw else {}
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def lines(self, path: str) -> AsyncGenerator[str]:
        """The text at `path` line by line as the server sends it (a pod's log, followed):
        no time limit but the server's."""
        session = self._session or self._open()
        async with session.get(
            request_url(self._server, path), timeout=aiohttp.ClientTimeout(total=None)
        ) as response:
            if not 200 <= response.status <= 299:
                raise _error_of(response, await response.read())
            async for line in response.content:
                yield line.decode(errors="replace").rstrip("\n")

    async def create(self, obj: Obj, dry_run: bool = False) -> Obj | None:
        """Create `obj`: the object created, or None if one of its name existed already and is
        the same owner's (a create repeated). A name another owner's object holds raises
        `NameTakenError`. `dry_run`: only ask whether the API server (its admission included)
        would create it."""
        metadata = obj["metadata"]
        collection = collection_path(obj["apiVersion"], obj["kind"], metadata["namespace"])
        try:
            return await self.request("POST", collection + ("?dryRun=All" if dry_run else ""), obj)
        except ConflictError:
            owner = _controller_of(obj)
            if dry_run or owner is None:
                return None
            path = object_path(
                obj["apiVersion"], obj["kind"], metadata["namespace"], metadata["name"]
            )
            holder = await self.get(path)
            if holder is None:
                raise  # gone since: the next look creates it
            held = _controller_of(holder)
            if held is not None and held.get("uid") == owner.get("uid"):
                return None
            raise NameTakenError(obj, holder) from None

    async def get(self, path: str) -> Obj | None:
        """The object at `path`, or None if there is none."""
        try:
            return await self.request("GET", path)
        except NotFoundError:
            return None

    async def serves(self, api_version: str) -> bool:
        """Whether the API server serves `api_version` (group/version): its discovery."""
        try:
            await self.request("GET", f"/apis/{api_version}")
        except NotFoundError:
            return False
        return True

    async def newest_event_message(self, namespace: str, uid: str, reason: str) -> str | None:
        """The message of the newest Event of `reason` about the object `uid`, if any."""
        selector = quote(f"involvedObject.uid={uid},reason={reason}")
        path = f"{collection_path('v1', 'Event', namespace)}?fieldSelector={selector}"
        found = (await self.request("GET", path) or {}).get("items") or []
        if not found:
            return None
        newest = max(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return str(newest.get("message") or "") or None

    async def patch(self, path: str, patch: Obj) -> Obj | None:
        """Merge-patch the object at `path`; the updated object, or None if it is gone."""
        try:
            return await self.request("PATCH", path, patch, MERGE_PATCH)
        except NotFoundError:
            return None

    async def delete_pod(
        self,
        namespace: str,
        name: str,
        force: bool = False,
        grace_seconds: int | None = None,
        uid: str | None = None,
    ) -> None:
        """Delete a pod; `force`: at once (grace period 0), without its kubelet's word; else
        with `grace_seconds` (None: the pod's own terminationGracePeriodSeconds). `uid`: only
        if the name is still that pod (the API server answers 409 for another, left alone)."""
        grace = 0 if force else grace_seconds
        body: Obj = {}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        path = object_path("v1", "Pod", namespace, name)
        with contextlib.suppress(NotFoundError, ConflictError):  # 409: the precondition
            await self.request("DELETE", path, body or None)

    async def patch_job_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        """Merge-patch the job's status; the updated job, or None if the job is gone."""
        path = job_path(namespace, name) + "/status"
        try:
            return await self.request("PATCH", path, {"status": status}, MERGE_PATCH)
        except NotFoundError:
            return None

    async def delete_mpijob(self, namespace: str, name: str) -> None:
        """Delete an MPIJob in the foreground: it is gone only once its pods are, so the next
        attempt's MPIJob of the same name never meets the last one's children."""
        path = object_path(names.MPIJOB_API_VERSION, names.MPIJOB_KIND, namespace, name)
        with contextlib.suppress(NotFoundError):
            await self.request("DELETE", path, {"propagationPolicy": "Foreground"})

    async def suspend_mpijob(
        self, namespace: str, name: str, suspend: bool, placement: Sequence[Obj] = ()
    ) -> None:
        """Set the MPIJob's runPolicy.suspend; `placement`: JSON patch operations applied with
        it (`launchers.mpi.mpijob_placement`)."""
        path = object_path(names.MPIJOB_API_VERSION, names.MPIJOB_KIND, namespace, name)
        suspended = {"op": "add", "path": "/spec/runPolicy/suspend", "value": suspend}
        with contextlib.suppress(NotFoundError):
            await self.request("PATCH", path, [*placement, suspended], JSON_PATCH)

    async def delete_job(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self.request(
                "DELETE", job_path(namespace, name), {"propagationPolicy": "Background"}
            )


def _error_of(response: aiohttp.ClientResponse, body: bytes) -> ApiError:
    return api_error(response.status, _message(body.decode(errors="replace"), response.reason))


def _message(text: str, reason: str | None) -> str:
    try:
        return str(orjson.loads(text)["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip() or str(reason)
