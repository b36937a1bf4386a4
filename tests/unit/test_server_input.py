"""What the models accept as the API server does: nulls as unset, whole numbers as integers
(tried first against kube-apiserver 1.36). The refusals are rows of tests/api_cases.py, checked
in both tiers; tests/cluster/test_render_agreement.py compares the two on generated specs."""

from __future__ import annotations

from tests.unit.support import make_job


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
