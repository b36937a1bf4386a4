"""RBAC is on, and ServiceAccount tokens from the TokenRequest API authenticate."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from tests.cluster.support import Cluster, wait_for


def test_service_account_token_needs_a_role_binding(cluster: Cluster, namespace: str) -> None:
    core = cluster.core
    rbac = cluster.rbac
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    request = {"spec": {"audiences": [], "expirationSeconds": 600}}
    token = core.create_namespaced_service_account_token("reader", namespace, request).status.token

    with cluster.client_with_token(token) as reader_client:
        reader: Any = kubernetes.client.CoreV1Api(reader_client)
        with pytest.raises(kubernetes.client.ApiException) as denied:
            reader.list_namespaced_pod(namespace)
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in str(denied.value.body)

        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "reader-reads-pods"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        )

        def allowed() -> bool:
            try:
                reader.list_namespaced_pod(namespace)
            except kubernetes.client.ApiException as error:
                if error.status != 403:
                    raise
                return False
            return True

        wait_for(allowed, "the RoleBinding to take effect", timeout=10)
        with pytest.raises(kubernetes.client.ApiException) as still_denied:
            reader.list_namespaced_secret(namespace)
        assert still_denied.value.status == 403
