"""The generated CRD: committed copy in sync, structural, documented, and tied to the trainer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import yaml

from ddp_trainer import contract
from ddp_trainer.options import TrainerOptions
from kube_ddp import api
from kube_ddp.crd import OBJECT_RULES, custom_resource_definition
from tests.unit.support import KUBERNETES_VERSION, REPO

CRD = custom_resource_definition()
ROOT = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
SPEC = ROOT["properties"]["spec"]


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from walk(schema[key], f"{path}[]")


def test_committed_crd_matches_the_models() -> None:
    committed = yaml.safe_load((REPO / "manifests" / "crd.yaml").read_text())
    assert committed == CRD, "manifests/crd.yaml is stale: run `make crds`"


def test_crd_object_is_valid() -> None:
    kubernetes_validate.validate(CRD, KUBERNETES_VERSION, strict=True)


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "$defs", "const", "title", "nullable", "prefixItems", "oneOf"}
    for path, node in walk(ROOT):
        assert not forbidden & set(node), f"{path}: {forbidden & set(node)}"
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
        else:
            assert "type" in node, f"{path} has no type"
        if node.get("exclusiveMinimum") is not None:
            assert node["exclusiveMinimum"] is True, path


def _refused(schema: dict[str, Any]) -> set[str]:
    """The keys of `schema` a rule refuses outright (`!has(self.key)`: UNSUPPORTED keys)."""
    rules = [v["rule"] for v in schema.get("x-kubernetes-validations", [])]
    return {r.removeprefix("!has(self.").removesuffix(")") for r in rules if r.startswith("!has(")}


def _unbounded(schema: dict[str, Any], path: str) -> Iterator[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return  # a Kubernetes type, validated in full where the pod or Service is created
    kind = schema.get("type")
    either = schema.get("x-kubernetes-int-or-string", False)
    if "enum" not in schema and schema.get("format") != "date-time":
        if (kind == "string" or either) and "maxLength" not in schema:
            yield f"{path}: a string with no maxLength"
        if (kind in ("integer", "number") or either) and "maximum" not in schema:
            yield f"{path}: a number with no maximum"
    if kind == "integer" or either:
        for bound in ("maximum", "minimum"):
            if abs(schema.get(bound, 0)) > contract.MAX_INT:  # read as a float, then refused
                yield f"{path}: a {bound} the API server takes for no integer"
    if kind == "array" and "maxItems" not in schema:
        yield f"{path}: a list with no maxItems"
    if isinstance(schema.get("additionalProperties"), dict) and "maxProperties" not in schema:
        yield f"{path}: a map with no maxProperties"
    refused = _refused(schema)
    for name, child in schema.get("properties", {}).items():
        if name not in refused:
            yield from _unbounded(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _unbounded(schema[key], f"{path}[]")


def test_every_string_number_list_and_map_is_bounded() -> None:
    """What a job file or a pod writes is bounded in the API server: every string has a
    maxLength, every number a maximum, every list maxItems and every map maxProperties (the
    objects of Kubernetes' own types the template passes through are validated where the pods
    are created)."""
    for top in ("spec", "status"):
        assert list(_unbounded(ROOT["properties"][top], top)) == []


def test_every_spec_and_status_field_is_described() -> None:
    for top in ("spec", "status"):
        for path, node in walk(ROOT["properties"][top], top):
            if not path.endswith("[]"):
                assert node.get("description"), f"{path} has no description"


def test_cross_field_rules_are_cel_validations() -> None:
    rules = [
        rule["rule"] for _, node in walk(ROOT) for rule in node.get("x-kubernetes-validations", [])
    ]
    models = [api.DDPTrainingJobSpec, api.Accelerator, api.ElasticPolicy]
    models += [api.EnvVar, api.Resources, api.PodTemplateOverrides, api.GangPolicy]
    models += [api.NetworkPolicySettings]
    expected = [rule.cel for model in models for rule in model.RULES]
    expected += [rule["rule"] for rule in [*api.transition_rules(), *OBJECT_RULES]]
    for model in (api.PodTemplateOverrides, api.ContainerSettings):
        expected += [f"!has(self.{key})" for key in model.UNSUPPORTED]
    assert sorted(rules) == sorted(expected)


def test_unsupported_keys_are_refused_by_a_rule_that_says_why() -> None:
    template = SPEC["properties"]["template"]
    messages = {r["rule"]: r["message"] for r in template["x-kubernetes-validations"]}
    assert messages["!has(self.restartPolicy)"] == (
        "restartPolicy is not supported: restarts are kube-ddp's, for the whole group: use "
        "runPolicy.restartPolicy"
    )
    assert template["properties"]["restartPolicy"]["type"] == "string"  # CEL must know it


def test_live_jobs_keep_their_shape_but_not_their_run_policy() -> None:
    transitions = [r["rule"] for r in SPEC["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
    spec_fields = set(SPEC["properties"])
    guarded = {f for f in spec_fields if any(f"self.{f} ==" in rule for rule in transitions)}
    assert guarded == spec_fields - {"runPolicy"}


def test_trainer_keys_are_exactly_the_trainer_options() -> None:
    trainer = SPEC["properties"]["trainer"]["properties"]
    aliases = {field.alias for field in TrainerOptions.model_fields.values()}
    assert set(trainer) == aliases
    assert not any("default" in node for _, node in walk(SPEC["properties"]["trainer"]))


def test_printer_columns_point_at_schema_fields() -> None:
    columns = CRD["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Phase",
        "Workers",
        "Accelerator",
        "Epoch",
        "Val-Acc",
        "Progress",
        "ETA",
        "Restarts",
        "Age",
    ]
    for column in columns:
        node = ROOT
        for part in column["jsonPath"].strip(".").split("."):
            if part == "metadata":
                break
            node = node["properties"][part]
        else:
            assert node["type"] in ("integer", "number", "string"), column


def test_names_status_subresource_and_lists() -> None:
    names = CRD["spec"]["names"]
    assert (names["kind"], names["plural"]) == ("DDPTrainingJob", "ddptrainingjobs")
    assert names["shortNames"] == ["ddpjob", "ddpj", "ddpjobs"]
    assert names["categories"] == ["kubeddp"]
    assert CRD["spec"]["versions"][0]["subresources"] == {"status": {}}
    conditions = ROOT["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert SPEC["properties"]["env"]["x-kubernetes-list-map-keys"] == ["name"]


def test_server_side_defaults_let_cel_rules_read_the_accelerator() -> None:
    assert SPEC["properties"]["accelerator"]["default"] == {"type": "cpu"}
    assert SPEC["properties"]["accelerator"]["properties"]["type"]["default"] == "cpu"
    assert SPEC["properties"]["backend"]["default"] == "auto"
