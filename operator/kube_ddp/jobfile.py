"""A job file as a user writes it: read, validated by the API models, and every problem said in
one line that names the field (`InputError` for the CLI, `describe_errors` for the operator's
Failed status too)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kube_ddp import kueue, names
from kube_ddp.api import (
    ContainerSettings,
    DDPTrainingJob,
    PodTemplateOverrides,
    load_job,
    unsupported_message,
)


class InputError(Exception):
    """Bad input: printed as is, one problem a line, and the command exits 2."""


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line: where the parser gave up, and why."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    if mark is None:
        return str(problem)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


# The most values a job file may hold once its aliases are expanded: a real job has hundreds;
# a file of nested aliases a kilobyte long can hold billions, and every step after parsing
# (validation, rendering) walks them all.
MAX_EXPANDED_VALUES = 100_000


def _expanded_values(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values `node` stands for with its aliases expanded (each node counted once)."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = 1  # a node that holds itself (a recursive alias) counts once
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    total = 1 + sum(_expanded_values(child, sizes) for child in children)
    sizes[id(node)] = total
    return total


def _check_aliases(text: str) -> None:
    """Refuse a file whose aliases expand past MAX_EXPANDED_VALUES, naming the line."""
    sizes: dict[int, int] = {}
    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if document is not None and _expanded_values(document, sizes) > MAX_EXPANDED_VALUES:
            line = document.start_mark.line + 1
            raise yaml.YAMLError(
                f"line {line}: the document holds more than {MAX_EXPANDED_VALUES} values once "
                "its aliases (*name) are expanded"
            )


def read_jobs(path: str, namespace: str | None) -> list[DDPTrainingJob]:
    """Every DDPTrainingJob in a YAML file ('-' for stdin), validated by the API models."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror}") from error
    try:
        _check_aliases(text)
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {_yaml_problem(error)}") from error
    if not documents:
        raise InputError(f"{path}: no DDPTrainingJob in the file")
    jobs, problems = [], []
    for number, document in enumerate(documents, start=1):
        where = path if len(documents) == 1 else f"{path} (document {number})"
        if not isinstance(document, dict):
            problems.append(f"{where}: expected a {names.KIND} mapping")
            continue
        try:
            job = load_job(document, namespace)
        except ValidationError as error:
            problems += [f"{where}: {line}" for line in describe_errors(error)]
            continue
        # What the operator fails a job for before it creates anything, and the API server
        # cannot check (its rules see no labels).
        if (refused := kueue.unqueued_refusal(job)) is not None:
            problems.append(f"{where}: spec.{refused}")
        jobs.append(job)
    if problems:
        raise InputError("\n".join(problems))
    return jobs


# A value of the wrong JSON type; as on the API server, nothing is converted.
_TYPE_ERRORS = frozenset(
    {
        "int_type",
        "int_from_float",
        "float_type",
        "bool_type",
        "string_type",
        "dict_type",
        "list_type",
        "model_type",
    }
)


def _what_was_given(value: Any, expected: str) -> str:
    if isinstance(value, str):
        return f" (got the string {value!r}: write it without quotes)"
    if isinstance(value, bool):
        return f" (got the boolean {str(value).lower()})"
    if isinstance(value, int | float):
        return f" (got the number {value}" + (": quote it)" if expected == "string_type" else ")")
    kinds = {type(None): "null", dict: "a mapping", list: "a list"}
    return f" (got {kinds.get(type(value), type(value).__name__)})"


# Where a key that a model refuses belongs to: the model that says why it is unsupported.
_UNSUPPORTED_AT = {
    ("template",): PodTemplateOverrides.UNSUPPORTED,
    ("template", "container"): ContainerSettings.UNSUPPORTED,
}
_CONTAINER_KEYS = {field.alias or name for name, field in ContainerSettings.model_fields.items()}


def _unknown_field(loc: tuple[Any, ...]) -> str:
    *parents, key = (str(part) for part in loc)
    for where, unsupported in _UNSUPPORTED_AT.items():
        if tuple(parents[-len(where) :]) == where and key in unsupported:
            return unsupported_message(key, unsupported[key]).removeprefix(f"{key} is ")
    if parents[-1:] == ["template"] and key in _CONTAINER_KEYS:
        return f"a container's setting: write it as template.container.{key}"
    return "unknown field: check its spelling (keys are camelCase)"


def describe_errors(error: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem: the field path as written in YAML, then what is wrong."""
    lines = []
    for item in error.errors(include_url=False):
        path = prefix
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = _unknown_field(item["loc"])
        elif item["type"] == "missing":
            message = "required field is missing"
        shown = item.get("input")
        if item["type"] in ("literal_error", "enum") and shown is not None:
            message += f" (got {shown!r})"
        elif item["type"] in _TYPE_ERRORS:
            message += _what_was_given(shown, item["type"])
        lines.append(f"{path or '<document>'}: {message}")
    return lines
