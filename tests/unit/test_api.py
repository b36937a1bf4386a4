"""The API models: defaults, derived values, and every rule's rejection, as a table."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from kube_ddp import names
from kube_ddp.api import Model, Rule, load_job
from kube_ddp.jobfile import describe_errors
from tests.api_cases import REJECTIONS, Rejection
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


@pytest.mark.parametrize("case", REJECTIONS, ids=[case.id for case in REJECTIONS])
def test_rejected_with_the_field_and_the_fix(case: Rejection) -> None:
    lines = problems(case.spec)
    assert any(line.startswith(case.problem) for line in lines), lines


def _all_rules() -> list[Rule]:
    models, rules = [Model], []
    while models:
        model = models.pop()
        models += model.__subclasses__()
        rules += [rule for rule in model.RULES if rule not in rules]
    return rules


@pytest.mark.parametrize("rule", _all_rules(), ids=lambda rule: rule.cel[:60])
def test_every_cross_field_rule_has_a_case(rule: Rule) -> None:
    """...so that the cluster tier checks its CEL twin on the real API server."""
    fixed_words = max(re.split(r"\{[^}]*\}", rule.message), key=len)
    assert [case for case in REJECTIONS if case.rule and fixed_words in case.problem]


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


def test_a_successors_name_gives_back_its_worker() -> None:
    """A worker's pods, its first and its successors (`-r1`...), all name its index; no other
    pod name does."""
    for generation in (0, 1, 12):
        assert names.worker_index("bar", names.successor_name("bar", 3, generation)) == 3
    assert names.successor_name("bar", 3, 0) == names.worker_name("bar", 3)
    others = ("bar-worker-", "bar-worker-3-r", "bar-worker-3-rx", "bar-launcher", "baz-worker-3")
    for other in others:
        assert names.worker_index("bar", other) is None, other


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
