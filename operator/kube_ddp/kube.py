"""The operator's few calls to the Kubernetes API (kubernetes_asyncio), each idempotent.

Creating what exists, or deleting what is gone, is success: reconciles repeat freely.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from kube_ddp import names

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# Skip deserialising responses into model classes we never read: it is most of the cost.
RAW = {"_preload_content": False}


async def load_configuration(kubeconfig: str | None) -> client.Configuration:
    """In-cluster credentials, else the kubeconfig (explicit path, $KUBECONFIG, ~/.kube)."""
    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration
        except config.ConfigException:
            pass
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return configuration


def connection_info(configuration: client.Configuration) -> kopf.ConnectionInfo:
    """The same credentials for kopf's own watches."""
    scheme, token = None, None
    authorization = (configuration.api_key or {}).get("authorization") or (
        configuration.api_key or {}
    ).get("BearerToken")
    if authorization:
        scheme, _, token = str(authorization).partition(" ")
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        scheme=scheme,
        token=token,
    )


def _tolerate(error: ApiException, *statuses: int) -> None:
    if error.status not in statuses:
        raise error


async def _finish(response: Any) -> None:
    """Release a raw response, raising ApiException for an error status as the client would."""
    try:
        if not 200 <= response.status <= 299:
            error = ApiException(status=response.status, reason=response.reason)
            error.body = await response.read()
            raise error
    finally:
        response.release()


class Kube:
    """Typed, idempotent verbs over one API client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # Typed as Any: we send plain dicts and read raw responses, not the client's models.
        self.core: Any = client.CoreV1Api(api)
        self.rbac: Any = client.RbacAuthorizationV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    async def create(self, obj: Obj) -> bool:
        """Create `obj`; False if it already existed."""
        namespace = obj["metadata"]["namespace"]
        kind = obj["kind"]
        creators = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ServiceAccount": self.core.create_namespaced_service_account,
            "Role": self.rbac.create_namespaced_role,
            "RoleBinding": self.rbac.create_namespaced_role_binding,
            "Event": self.core.create_namespaced_event,
        }
        try:
            if kind == "MPIJob":
                group, version = obj["apiVersion"].split("/")
                response = await self.custom.create_namespaced_custom_object(
                    group, version, namespace, "mpijobs", obj, **RAW
                )
            else:
                response = await creators[kind](namespace, obj, **RAW)
            await _finish(response)
            return True
        except ApiException as error:
            _tolerate(error, 409)
            return False

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            response = await self.core.delete_namespaced_pod(name, namespace, **RAW)
            await _finish(response)
        except ApiException as error:
            _tolerate(error, 404)

    async def patch_job_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        """Merge-patch the job's status; the updated job, or None if the job is gone."""
        try:
            result: Obj = await self.custom.patch_namespaced_custom_object_status(
                names.GROUP,
                names.VERSION,
                namespace,
                names.PLURAL,
                name,
                {"status": status},
                _content_type=MERGE_PATCH,
            )
            return result
        except ApiException as error:
            _tolerate(error, 404)
            return None

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self.custom.delete_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace,
                names.PLURAL,
                name,
                propagation_policy="Background",
            )
        except ApiException as error:
            _tolerate(error, 404)
