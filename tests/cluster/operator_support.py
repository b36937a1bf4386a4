"""Running the real operator (`kube-ddp operator`) against the local control plane."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes

from kube_ddp import names, status_policy
from tests.cluster.support import ChildProcess, Cluster, wait_for

KUBE_DDP = Path(sys.executable).with_name("kube-ddp")
SIM_EXIT_CODE = "sim.kubeddp.io/exit-code"


def service_account_token(cluster: Cluster, namespace: str, account: str) -> str:
    """A token of `account` (a TokenRequest): what a pod running as it holds."""
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    response = cluster.core.create_namespaced_service_account_token(account, namespace, request)
    return str(response.status.token)


def username(api: kubernetes.client.ApiClient) -> str:
    """Who the API server takes `api`'s credentials for (a SelfSubjectReview)."""
    review = kubernetes.client.AuthenticationV1Api(api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(review.status.user_info.username)


TENANT = "tenant"


def make_tenant(cluster: Cluster, namespace: str) -> None:
    """An account (`TENANT`) that may create, read and patch pods in `namespace`, and nothing
    else: a team's member, or a job's code given such a Role."""
    meta = {"name": TENANT}
    cluster.core.create_namespaced_service_account(namespace, {"metadata": meta})
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "patch"]}]
    cluster.rbac.create_namespaced_role(namespace, {"metadata": meta, "rules": rules})
    binding = {
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT},
        "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}],
    }
    cluster.rbac.create_namespaced_role_binding(namespace, binding)


def core_as(cluster: Cluster, namespace: str, account: str) -> kubernetes.client.CoreV1Api:
    """The core API with a fresh token of `account`."""
    token = service_account_token(cluster, namespace, account)
    return kubernetes.client.CoreV1Api(cluster.client_with_token(token))


@contextmanager
def admission_policy_in(
    cluster: Cluster, namespace: str, module: ModuleType = status_policy
) -> Iterator[str]:
    """One of the chart's policies (`module.policy`: the status policy, or the pod policy) for
    `namespace`, the tests' operator (the admin client's user) exempt, as the chart exempts
    the operator's account."""
    name = f"kube-ddp-{module.__name__.rsplit('.', 1)[-1].replace('_', '-')}-{namespace}"
    admission = kubernetes.client.AdmissionregistrationV1Api(cluster.api)
    admission.create_validating_admission_policy(module.policy(name, username(cluster.api)))
    admission.create_validating_admission_policy_binding(status_policy.binding(name, namespace))
    try:
        yield name
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


@dataclass
class OperatorProcess(ChildProcess):
    """One `kube-ddp operator` process watching one namespace, its log in a file."""

    cluster: Cluster
    namespace: str
    log_path: Path
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        command = [
            str(KUBE_DDP),
            "operator",
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--namespace={self.namespace}",
            "--health-port=0",
            "--metrics-port=0",
            "--trainer-image=registry.invalid/kube-ddp/trainer:test",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ}
            )


def namespace_story(cluster: Cluster, namespace: str) -> str:
    """What a failed test's reader wants next to the operator's log: the namespace's Events
    (ours, the scheduler's, the taint manager's...) and where its pods stand. The cluster
    tier's conftest adds it to the report of a test that failed, while the namespace lives."""
    events = cluster.kubectl(
        "get", "events", f"--namespace={namespace}", "--sort-by=.lastTimestamp", check=False
    )
    pods = cluster.kubectl("get", "pods", f"--namespace={namespace}", "--output=wide", check=False)
    story = f"{events.stdout}{events.stderr}"[-6000:]
    return f"---- events ----\n{story}\n---- pods ----\n{pods.stdout}{pods.stderr}"[-9000:]


@contextmanager
def running_operator(
    cluster: Cluster, namespace: str, log_dir: Path, *extra_args: str
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(cluster, namespace, log_dir / "operator.log", extra_args)
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
        # pytest shows a test's captured output only when it fails: then this log is there.
        print("---- operator log ----\n" + operator.log()[-6000:])


def job_manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


class Jobs:
    """DDPTrainingJobs and their pods in one namespace, through the admin client."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.cluster.custom_objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, names.PLURAL, manifest
        )
        return result

    def get(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.cluster.custom_objects.get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, names.PLURAL, name
        )
        return result

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def report_training(self, name: str, training: dict[str, Any]) -> None:
        """Merge `training` into the job's status.training, as rank 0 of the trainer does."""
        self.cluster.custom_objects.patch_namespaced_custom_object_status(
            names.GROUP,
            names.VERSION,
            self.namespace,
            names.PLURAL,
            name,
            {"status": {"training": training}},
        )

    def delete(self, name: str) -> None:
        self.cluster.custom_objects.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, names.PLURAL, name
        )

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(
            lambda: (s := self.status(name)).get("phase") == phase and s,
            f"{name} to reach phase {phase}",
            timeout=timeout,
        )

    def pods(self, job: str) -> list[Any]:
        selector = f"{names.LABEL_JOB_NAME}={job}"
        items = self.cluster.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return sorted(items.items, key=lambda p: p.metadata.name)

    def wait_pods(
        self, job: str, count: int, phase: str = "Running", attempt: int = 0, timeout: float = 30
    ) -> list[Any]:
        def ready() -> list[Any] | None:
            pods = [
                p
                for p in self.pods(job)
                if p.status.phase == phase
                and p.metadata.labels.get(names.LABEL_ATTEMPT) == str(attempt)
                and p.metadata.deletion_timestamp is None
            ]
            return pods if len(pods) == count else None

        return wait_for(ready, f"{count} {phase} pods of {job} (attempt {attempt})", timeout)

    def wait_workers(
        self, job: str, count: int, attempt: int = 0, timeout: float = 30
    ) -> dict[int, Any]:
        """`wait_pods`' running pods by worker index: a successor's pod name is not its
        worker's first (`names.successor_name`)."""
        pods = self.wait_pods(job, count, attempt=attempt, timeout=timeout)
        return {int(p.metadata.labels[names.LABEL_REPLICA_INDEX]): p for p in pods}

    def end_worker(self, pod_name: str, exit_code: int) -> None:
        """Make a running worker exit with `exit_code` (kwok's simulated kubelet obeys)."""
        body = {"metadata": {"annotations": {SIM_EXIT_CODE: str(exit_code)}}}
        self.cluster.core.patch_namespaced_pod(pod_name, self.namespace, body)

    def events(self, name: str) -> list[str]:
        items = self.cluster.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        ).items
        return [e.reason for e in sorted(items, key=lambda e: e.metadata.creation_timestamp)]

    def wait_events(self, name: str, *reasons: str, timeout: float = 10) -> list[str]:
        """The job's Event reasons once every one of `reasons` is among them: the operator
        posts a decision's Events after the status write it decided, so a test that has just
        seen the status waits for them."""
        return wait_for(
            lambda: set(reasons) <= set(said := self.events(name)) and said,
            f"the Events {', '.join(reasons)} on {name}",
            timeout=timeout,
        )


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env}
