"""The models type a spec as the API server does (each case here was first tried against
kube-apiserver 1.36 with a server-side dry run; tests/cluster/test_render_agreement.py keeps
checking the two agree on generated specs)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kube_ddp.api import describe_errors
from tests.unit.support import make_job


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"nodes": "2"}, "spec.nodes: Input should be a valid integer (got the string '2': "),
        ({"nodes": True}, "spec.nodes: Input should be a valid integer (got the boolean true)"),
        ({"nodes": 2.5}, "spec.nodes: Input should be a valid integer (got the number 2.5)"),
        ({"nodes": None}, "spec.nodes: required field is missing"),
        ({"nodes": 1, "image": 3}, "spec.image: Input should be a valid string (got the number 3"),
        (
            {"nodes": 1, "runPolicy": {"suspend": "true"}},
            "spec.runPolicy.suspend: Input should be a valid boolean (got the string 'true'",
        ),
        ({"nodes": 1, "trainer": {"epochs": "3"}}, "spec.trainer.epochs: Input should be a valid"),
        ({"nodes": 1, "resources": {"limits": {"cpu": 0.5}}}, "spec.resources.limits.cpu"),
        ({"nodes": 1, "env": [None]}, "spec.env[0]: Input should be a valid dictionary"),
        ({"nodes": 1, "command": ["python", 3]}, "spec.command[1]: Input should be a valid string"),
        ({"nodes": 1, "run_policy": {}}, "spec.run_policy: unknown field"),
    ],
)
def test_the_server_refuses_other_types(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as error:
        make_job(**spec)
    assert any(line.startswith(problem) for line in describe_errors(error.value))


def test_a_null_field_is_unset_and_gets_its_default() -> None:
    job = make_job(
        nodes=2,
        port=None,
        accelerator=None,
        image=None,
        trainer={"epochs": None, "lr": 1},
        runPolicy={"backoffLimit": None, "activeDeadlineSeconds": None},
        env=[{"name": "A", "value": None}],
        template={"labels": {"team": "a", "gone": None}, "affinity": {"kept": None}},
    )
    spec = job.spec
    assert (spec.port, spec.accelerator.type, spec.image) == (29500, "cpu", None)
    assert spec.trainer is not None and spec.trainer.epochs == 10 and spec.trainer.lr == 1.0
    assert spec.run_policy.backoff_limit == 3
    assert spec.env[0].value is None
    assert spec.template.labels == {"team": "a"}  # a typed map's null values are pruned
    assert spec.template.affinity == {"kept": None}  # free-form objects keep theirs


def test_a_whole_number_is_an_integer() -> None:
    job = make_job(nodes=2.0, trainer={"wrnDepth": 16.0}, resources={"limits": {"cpu": 2.0}})
    assert job.spec.nodes == 2 and isinstance(job.spec.nodes, int)
    assert job.spec.resources.limits == {"cpu": 2}
