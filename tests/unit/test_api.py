"""The API models: defaults, derived values, and every rule's rejection, as a table."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kube_ddp import names
from kube_ddp.api import describe_errors, load_job
from tests.unit.support import job_document, make_job


def problems(spec: dict[str, Any], **metadata: Any) -> list[str]:
    document = job_document(spec)
    document["metadata"].update(metadata)
    with pytest.raises(ValidationError) as caught:
        load_job(document)
    return describe_errors(caught.value)


def test_cpu_job_defaults() -> None:
    job = make_job(nodes=3)
    assert job.spec.accelerator.type == "cpu"
    assert job.spec.procs_per_node == 1
    assert job.spec.world_size == 3
    assert job.spec.effective_backend == "gloo"
    assert job.spec.launcher == "torchrun"
    assert job.spec.port == 29500
    assert job.spec.run_policy.backoff_limit == 3
    assert job.spec.run_policy.restart_policy == "ExitCode"
    assert job.spec.run_policy.clean_pod_policy == "Running"
    assert job.spec.run_policy.suspend is False


@pytest.mark.parametrize(
    ("accelerator", "backend"), [("nvidia", "nccl"), ("gaudi", "hccl"), ("amd", "nccl")]
)
def test_accelerators_pick_their_backend_and_processes(accelerator: str, backend: str) -> None:
    job = make_job(nodes=2, accelerator={"type": accelerator, "perNode": 8})
    assert job.spec.effective_backend == backend
    assert job.spec.procs_per_node == 8
    assert job.spec.world_size == 16


def test_explicit_nproc_and_backend_win() -> None:
    job = make_job(
        nodes=2, accelerator={"type": "nvidia", "perNode": 8}, nprocPerNode=4, backend="gloo"
    )
    assert (job.spec.procs_per_node, job.spec.world_size, job.spec.effective_backend) == (
        4,
        8,
        "gloo",
    )


def test_namespace_defaults_and_override() -> None:
    document = job_document({"nodes": 1})
    del document["metadata"]["namespace"]
    assert load_job(document).namespace == "default"
    assert load_job(document, namespace="team-a").namespace == "team-a"


REJECTED: list[tuple[str, dict[str, Any], str]] = [
    ("no nodes", {}, "spec.nodes: required field is missing"),
    ("zero nodes", {"nodes": 0}, "spec.nodes: Input should be greater than or equal to 1"),
    ("nodes a string", {"nodes": "two"}, "spec.nodes: Input should be a valid integer"),
    (
        "unknown accelerator",
        {"nodes": 1, "accelerator": {"type": "tpu", "perNode": 4}},
        "spec.accelerator.type: Input should be 'nvidia', 'gaudi', 'amd' or 'cpu' (got 'tpu')",
    ),
    (
        "gpu without perNode",
        {"nodes": 1, "accelerator": {"type": "nvidia"}},
        "spec.accelerator: perNode is required for accelerator type nvidia",
    ),
    (
        "unknown field",
        {"nodes": 1, "replicas": 2},
        "spec.replicas: unknown field: check its spelling (keys are camelCase)",
    ),
    (
        "snake_case key",
        {"nodes": 1, "run_policy": {}},
        "spec.run_policy: unknown field",
    ),
    (
        "nested unknown field",
        {"nodes": 1, "runPolicy": {"backofLimit": 2}},
        "spec.runPolicy.backofLimit: unknown field",
    ),
    (
        "negative backoffLimit",
        {"nodes": 1, "runPolicy": {"backoffLimit": -1}},
        "spec.runPolicy.backoffLimit: Input should be greater than or equal to 0",
    ),
    (
        "unknown cleanPodPolicy",
        {"nodes": 1, "runPolicy": {"cleanPodPolicy": "Some"}},
        "spec.runPolicy.cleanPodPolicy: Input should be 'Running', 'All' or 'None'",
    ),
    (
        "retryable exit code out of range",
        {"nodes": 1, "runPolicy": {"retryableExitCodes": [1, 300]}},
        "spec.runPolicy.retryableExitCodes[1]: Input should be less than or equal to 255",
    ),
    (
        "reserved env",
        {"nodes": 1, "env": [{"name": "HOME", "value": "/x"}, {"name": "WORLD_SIZE"}]},
        "spec.env[1]: WORLD_SIZE is reserved: kube-ddp sets it on every worker",
    ),
    (
        "duplicate env",
        {"nodes": 1, "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "spec.env: duplicate env names: A",
    ),
    (
        "env value and valueFrom",
        {"nodes": 1, "env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]},
        "spec.env[0]: set value or valueFrom, not both",
    ),
    (
        "elastic min above max",
        {"nodes": 2, "elastic": {"minNodes": 3, "maxNodes": 2}},
        "spec.elastic: minNodes must not exceed maxNodes",
    ),
    (
        "nodes outside elastic range",
        {"nodes": 5, "elastic": {"minNodes": 1, "maxNodes": 4}},
        "spec: nodes must lie within elastic.minNodes..elastic.maxNodes",
    ),
    (
        "elastic with mpi",
        {"nodes": 2, "launcher": "mpi", "elastic": {"minNodes": 1, "maxNodes": 2}},
        "spec: elastic is not supported with launcher mpi",
    ),
    (
        "mpi settings with torchrun",
        {"nodes": 2, "mpi": {"socketsPerNode": 2}},
        "spec: mpi settings are only read with launcher mpi",
    ),
    ("args without command", {"nodes": 1, "args": ["x"]}, "spec: args needs command"),
    (
        "command and trainer",
        {"nodes": 1, "command": ["python", "x.py"], "trainer": {"epochs": 1}},
        "spec: set either command (your own program) or trainer",
    ),
    (
        "more processes than accelerators",
        {"nodes": 1, "accelerator": {"type": "nvidia", "perNode": 4}, "nprocPerNode": 8},
        "spec: nprocPerNode must not exceed accelerator.perNode",
    ),
    (
        "hccl on nvidia",
        {"nodes": 1, "accelerator": {"type": "nvidia", "perNode": 4}, "backend": "hccl"},
        "spec: backend hccl does not run on accelerator nvidia: use backend auto",
    ),
    (
        "nccl on cpu",
        {"nodes": 1, "backend": "nccl"},
        "spec: backend nccl does not run on accelerator cpu",
    ),
    (
        "owned label in template",
        {"nodes": 1, "template": {"labels": {names.LABEL_ATTEMPT: "9"}}},
        "spec.template: labels app.kubernetes.io/managed-by, kubeddp.io/job-name",
    ),
    (
        "unknown template key",
        {"nodes": 1, "template": {"hostNetwork": True}},
        "spec.template.hostNetwork: unknown field",
    ),
    (
        "accelerator device in resources",
        {"nodes": 1, "resources": {"limits": {"nvidia.com/gpu": 2}}},
        "spec.resources: accelerator devices in resources.limits are set by the operator",
    ),
    (
        "bad quantity",
        {"nodes": 1, "resources": {"requests": {"memory": "lots"}}},
        "spec.resources.requests.memory",
    ),
    (
        "trainer option unknown",
        {"nodes": 1, "trainer": {"epoch": 3}},
        "spec.trainer.epoch: unknown field",
    ),
    (
        "trainer option invalid",
        {"nodes": 1, "trainer": {"targetAccuracy": 1.5}},
        "spec.trainer.targetAccuracy: Input should be less than or equal to 1",
    ),
    (
        "trainer dataset unknown",
        {"nodes": 1, "trainer": {"dataset": "imagenet"}},
        "spec.trainer.dataset: Input should be 'mnist', 'fashion-mnist'",
    ),
]


@pytest.mark.parametrize(
    ("spec", "expected"), [(s, e) for _, s, e in REJECTED], ids=[c for c, _, _ in REJECTED]
)
def test_rejected_with_the_field_and_the_fix(spec: dict[str, Any], expected: str) -> None:
    assert any(line.startswith(expected) for line in problems(spec)), problems(spec)


@pytest.mark.parametrize("name", names.RESERVED_ENV)
def test_every_contract_name_is_reserved(name: str) -> None:
    (line,) = problems({"nodes": 1, "env": [{"name": name, "value": "x"}]})
    assert line.startswith(f"spec.env[0]: {name} is reserved")


@pytest.mark.parametrize("bad", ["Bar", "1bar", "bar_baz", "b" * 52, "bar-"])
def test_job_names_must_fit_worker_hostnames(bad: str) -> None:
    (line,) = problems({"nodes": 1}, name=bad)
    assert line.startswith("metadata.name: must be a DNS label of at most 51")


def test_longest_name_still_gives_valid_hostnames() -> None:
    job = load_job(job_document({"nodes": 1}, name="b" * 51))
    assert len(names.worker_name(job.name, 1023)) == 63


def test_every_problem_is_reported_at_once() -> None:
    lines = problems(
        {
            "nodes": 0,
            "accelerator": {"type": "gaudi"},
            "env": [{"name": "RANK", "value": "0"}],
            "bogus": 1,
        }
    )
    assert len(lines) == 4, lines


def test_wrong_kind_and_api_version() -> None:
    document = job_document({"nodes": 1})
    document["kind"] = "PyTorchJob"
    document["apiVersion"] = "kubeflow.org/v1"
    with pytest.raises(ValidationError) as caught:
        load_job(document)
    lines = describe_errors(caught.value)
    assert "kind: Input should be 'DDPTrainingJob' (got 'PyTorchJob')" in lines
    assert "apiVersion: Input should be 'kubeddp.io/v1alpha1' (got 'kubeflow.org/v1')" in lines
