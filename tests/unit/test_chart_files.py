"""The chart's generated files are current, its values documented, its RBAC tied to the code.

Rendering with the real helm binary and installing are tests/cluster/test_chart.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import ModuleType

import kubernetes_validate
import pytest
import yaml

import kube_ddp
from kube_ddp import kube, names
from kube_ddp.permissions import CLUSTER_RULES, JOB_RULES, lease_rules
from tests.unit.support import KUBERNETES_VERSION, REPO, load_hack_script


def load_chart_tool() -> ModuleType:
    return load_hack_script("chart")


CHART_TOOL = load_chart_tool()
GENERATED, PROBLEMS = CHART_TOOL.generated(with_helm=False)


@pytest.mark.parametrize("path", list(GENERATED), ids=lambda p: str(p.relative_to(REPO)))
def test_generated_file_is_current(path: Path) -> None:
    assert path.read_text() == GENERATED[path], f"{path.relative_to(REPO)} is stale: make manifests"


def test_every_value_is_described_typed_and_in_the_schema() -> None:
    assert PROBLEMS == []


def test_the_values_check_can_fail() -> None:
    text = "replicaCount: 1\n# -- Typo'd.\nreplicas: 2\nimage:\n  tag: x\n"
    docs = CHART_TOOL.value_descriptions(text)
    schema = {
        "properties": {
            "replicaCount": {"type": "integer"},
            "image": {"type": "object", "properties": {"tag": {}, "repository": {}}},
        }
    }
    problems = CHART_TOOL.values_problems(yaml.safe_load(text), schema, docs)
    assert sorted(problems) == [
        "image.repository: in values.schema.json, not in values.yaml",
        "image.tag: no `# --` description in values.yaml",
        "replicaCount: no `# --` description in values.yaml",
        "replicas: described in values.yaml, not in the schema",
        "replicas: in values.yaml, not in values.schema.json",
    ]


def test_one_version() -> None:
    pyproject = tomllib.loads((REPO / "operator" / "pyproject.toml").read_text())
    chart = yaml.safe_load((REPO / "charts" / "kube-ddp" / "Chart.yaml").read_text())
    version = pyproject["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version == kube_ddp.__version__


def test_chart_crd_is_manifests_crd() -> None:
    chart_crd = REPO / "charts" / "kube-ddp" / "crds" / "ddptrainingjobs.kubeddp.io.yaml"
    assert chart_crd.read_text() == (REPO / "manifests" / "crd.yaml").read_text()


def test_every_kind_the_operator_creates_has_a_create_rule() -> None:
    created = {(v, k) for (v, k) in kube.PLURALS if k != names.KIND}
    for api_version, kind in created:
        group = api_version.rpartition("/")[0]
        plural = kube.PLURALS[api_version, kind]
        assert any(
            r.api_group == group and plural in r.resources and "create" in r.verbs
            for r in JOB_RULES
        ), f"no create rule for {kind}"


def test_rules_are_least_privilege() -> None:
    for rule in (*JOB_RULES, *lease_rules("x")):
        assert "*" not in (rule.api_group, *rule.resources, *rule.verbs)
        assert "secrets" not in rule.resources
        assert rule.why
        assert not {"escalate", "bind", "impersonate"} & set(rule.verbs)


def test_the_operator_holds_what_the_reporter_role_grants() -> None:
    """Kubernetes refuses a Role that grants more than its creator holds."""
    from kube_ddp.builders import build_reporter_rbac
    from tests.unit.support import make_job

    role = next(o for o in build_reporter_rbac(make_job(nodes=1)) if o["kind"] == "Role")
    for granted in role["rules"]:
        for resource in granted["resources"]:
            for verb in granted["verbs"]:
                assert any(
                    r.api_group in granted["apiGroups"]
                    and resource in r.resources
                    and verb in r.verbs
                    and not r.resource_names
                    for r in JOB_RULES
                ), f"the operator cannot grant {verb} {resource}"


def job_policy_rules(mpi_jobs: bool) -> list[dict[str, list[str]]]:
    """The job rules (and the cluster ones) as PolicyRules, the MPIJob ones chosen or not."""
    chosen = {None, "rbac.kueue", *(["rbac.mpiJobs"] if mpi_jobs else [])}
    return [rule.policy_rule() for rule in (*JOB_RULES, *CLUSTER_RULES) if rule.only_if in chosen]


@pytest.mark.parametrize("mpi_jobs", [True, False])
def test_rules_make_a_valid_role(mpi_jobs: bool) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "kube-ddp", "namespace": "ns1"},
        "rules": job_policy_rules(mpi_jobs),
    }
    kubernetes_validate.validate(role, KUBERNETES_VERSION, strict=True)
    assert any("mpijobs" in r["resources"] for r in role["rules"]) is mpi_jobs
