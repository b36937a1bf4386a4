"""The DDPTrainingJob CustomResourceDefinition, generated from the API models.

pydantic emits JSON Schema 2020-12; the API server wants a structural OpenAPI v3 subset. The
conversion inlines refs, turns optional (`X | None`) into plain optional properties, int-or-
string unions into `x-kubernetes-int-or-string`, free-form dicts into preserve-unknown-fields,
and attaches each model's `Rule`s as CEL `x-kubernetes-validations`.
"""

from __future__ import annotations

from typing import Any

from kube_ddp import names
from kube_ddp.api import (
    MAX_NAME_LENGTH,
    NAME_MESSAGE,
    NAME_PATTERN,
    DDPTrainingJob,
    DDPTrainingJobSpec,
    JobStatus,
    Model,
    transition_rules,
)

Schema = dict[str, Any]

# JSON Schema keywords that have no place in a CRD schema.
_DROPPED_KEYS = ("title", "$defs")


def _inline(schema: Any, defs: dict[str, Schema]) -> Any:
    """Replace every `$ref` by the schema it names, keeping sibling keys (description)."""
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline({**target, **siblings}, defs)
    return {key: _inline(value, defs) for key, value in schema.items()}


_BRANCH_BOUNDS = ("pattern", "maxLength", "minLength", "maximum", "minimum")


def _is_null(schema: Schema) -> bool:
    return schema.get("type") == "null"


def _structural(schema: Any) -> Any:
    """Rewrite one inlined JSON Schema node (and its children) into the CRD dialect."""
    if isinstance(schema, list):
        return [_structural(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    node = {k: v for k, v in schema.items() if k not in _DROPPED_KEYS}

    branches = node.pop("anyOf", None)
    if branches is not None:
        branches = [b for b in branches if not _is_null(b)]  # optional: absent, never null
        types = sorted(b.get("type", "") for b in branches)
        if types == ["integer", "string"]:
            # The one union a structural schema allows, in exactly this form; each branch's
            # bounds move up beside it (a string's pattern and maxLength apply to strings
            # only, an integer's maximum to numbers only).
            node["x-kubernetes-int-or-string"] = True
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            for branch in branches:
                node.update({k: v for k, v in branch.items() if k in _BRANCH_BOUNDS})
            return node
        if len(branches) != 1:
            raise ValueError(f"no structural form for the union {branches}")
        return _structural({**branches[0], **node})

    if "const" in node:
        node["enum"] = [node.pop("const")]
    if isinstance(node.get("exclusiveMinimum"), int | float):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if isinstance(node.get("exclusiveMaximum"), int | float):
        node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True

    extra = node.get("additionalProperties")
    if extra is False:
        del node["additionalProperties"]
    elif extra is True or (
        node.get("type") == "object"
        and not node.get("properties")
        and ("additionalProperties" not in node)
    ):
        node.pop("additionalProperties", None)
        node["type"] = "object"
        node["x-kubernetes-preserve-unknown-fields"] = True
    elif node.get("type") == "array" and node.get("items") == {}:
        node["items"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

    for key in ("properties",):
        if key in node:
            node[key] = {name: _structural(child) for name, child in node[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _structural(node[key])
    return node


def _strip_defaults(schema: Any) -> Any:
    """Drop server-side defaults from a subtree (trainer options keep the trainer's own)."""
    if isinstance(schema, list):
        return [_strip_defaults(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: _strip_defaults(v) for k, v in schema.items() if k != "default"}


def openapi_schema(model: type[Model]) -> Schema:
    """The structural OpenAPI v3 schema of one model, refs inlined, rules attached."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return dict(_structural(_inline(raw, raw.get("$defs", {}))))


# Rules on the whole object: a status value bounded by the spec.
OBJECT_RULES: list[Schema] = [
    {
        "rule": "!has(self.status) || !has(self.status.replacing) || "
        "self.status.replacing.all(i, i < self.spec.nodes)",
        "message": "status.replacing names workers of this job: each index below spec.nodes",
    }
]


def _root_schema() -> Schema:
    spec = openapi_schema(DDPTrainingJobSpec)
    spec["x-kubernetes-validations"] += transition_rules()
    # The trainer's defaults live in the trainer image, which may be newer than this CRD;
    # status is written by the operator, which needs no defaulting.
    spec["properties"]["trainer"] = _strip_defaults(spec["properties"]["trainer"])
    status = _strip_defaults(openapi_schema(JobStatus))
    root: Schema = {
        "type": "object",
        "description": DDPTrainingJob.__doc__,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": MAX_NAME_LENGTH,
                        "pattern": NAME_PATTERN,
                        "description": NAME_MESSAGE,
                    }
                },
            },
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": OBJECT_RULES,
    }
    return root


PRINTER_COLUMNS: list[Schema] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Workers",
        "type": "integer",
        "jsonPath": ".status.workers.running",
        "description": "Worker pods running",
    },
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.accelerator.type"},
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.training.epoch"},
    {
        "name": "Val-Acc",
        "type": "number",
        "jsonPath": ".status.training.valAccuracy",
        "description": "Validation accuracy of the last epoch",
    },
    {
        "name": "Progress",
        "type": "integer",
        "jsonPath": ".status.training.progressPercentage",
        "description": "Percent of the planned steps done",
    },
    {
        "name": "ETA",
        "type": "integer",
        "jsonPath": ".status.training.estimatedRemainingSeconds",
        "description": "Seconds left at the current speed",
    },
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes", "priority": 1},
    {
        "name": "Ranks",
        "type": "integer",
        "jsonPath": ".status.training.worldSize",
        "description": "Ranks training now (fewer than planned while an elastic job is short)",
        "priority": 1,
    },
    {
        "name": "Preemptions",
        "type": "integer",
        "jsonPath": ".status.preemptions",
        "description": "Times the group was preempted and resumed",
        "priority": 1,
    },
    {
        "name": "Images/s",
        "type": "number",
        "jsonPath": ".status.training.imagesPerSec",
        "priority": 1,
    },
]


def custom_resource_definition() -> Schema:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{names.PLURAL}.{names.GROUP}",
            "labels": {"app.kubernetes.io/name": "kube-ddp"},
        },
        "spec": {
            "group": names.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": names.KIND,
                "listKind": f"{names.KIND}List",
                "plural": names.PLURAL,
                "singular": names.SINGULAR,
                "shortNames": list(names.SHORT_NAMES),
                "categories": [names.CATEGORY],
            },
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _root_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }
