"""A job file as a user writes it: read, validated by the API models, and every problem said in
one line that names the file's line and column, the field, and the near miss of a misspelt key
or word (`InputError` for the CLI, `describe_errors` for the operator's Failed status too)."""

from __future__ import annotations

import difflib
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

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


def _composed(text: str) -> list[yaml.Node]:
    """The file's documents as YAML nodes (which know their lines), refusing a file whose
    aliases expand past MAX_EXPANDED_VALUES, naming the line."""
    sizes: dict[int, int] = {}
    documents = [d for d in yaml.compose_all(text, Loader=yaml.SafeLoader) if d is not None]
    for document in documents:
        if _expanded_values(document, sizes) > MAX_EXPANDED_VALUES:
            line = document.start_mark.line + 1
            raise yaml.YAMLError(
                f"line {line}: the document holds more than {MAX_EXPANDED_VALUES} values once "
                "its aliases (*name) are expanded"
            )
    return documents


def _position(node: yaml.Node, loc: tuple[Any, ...]) -> str:
    """`line:column` of what `loc` names in `node`: its key's place (an item's own in a
    list), or the nearest parent's where the document does not hold it (a missing field)."""
    mark = node.start_mark
    for part in loc:
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
        elif isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == part), None)
            if pair is None:
                break
            mark = pair[0].start_mark
            node = pair[1]
            continue
        else:
            break
        mark = node.start_mark
    return f"{mark.line + 1}:{mark.column + 1}"


def read_jobs(path: str, namespace: str | None) -> list[DDPTrainingJob]:
    """Every DDPTrainingJob in a YAML file ('-' for stdin), validated by the API models."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror}") from error
    try:
        nodes = _composed(text)
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {_yaml_problem(error)}") from error
    if not documents:
        raise InputError(f"{path}: no DDPTrainingJob in the file")
    jobs, problems = [], []
    for number, (document, node) in enumerate(zip(documents, nodes, strict=True), start=1):
        where = path if len(documents) == 1 else f"{path} (document {number})"
        if not isinstance(document, dict):
            problems.append(f"{where}: expected a {names.KIND} mapping")
            continue
        try:
            job = load_job(document, namespace)
        except ValidationError as error:
            problems += [
                f"{path}:{_position(node, loc)}: {line}" for loc, line in _described(error)
            ]
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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (through Optional, lists, maps and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _keys_at(parents: list[Any]) -> list[str]:
    """The keys the job's model takes at `parents` (a loc without its last part)."""
    model: type[BaseModel] = DDPTrainingJob
    for part in parents:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        models = _models_in(field.annotation) if field is not None else []
        if not models:
            return []
        model = models[0]
    return [field.alias or name for name, field in model.model_fields.items()]


def _near_miss(word: str, choices: list[str]) -> str | None:
    folded = {choice.lower(): choice for choice in choices}
    if word.lower() in folded:  # batchsize for batchSize
        return folded[word.lower()]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return close[0] if close else None


def _unknown_field(loc: tuple[Any, ...]) -> str:
    *parents, key = (str(part) if not isinstance(part, int) else part for part in loc)
    for where, unsupported in _UNSUPPORTED_AT.items():
        if tuple(parents[-len(where) :]) == where and key in unsupported:
            return unsupported_message(key, unsupported[key]).removeprefix(f"{key} is ")
    if parents[-1:] == ["template"] and key in _CONTAINER_KEYS:
        return f"a container's setting: write it as template.container.{key}"
    meant = _near_miss(str(key), _keys_at(parents))
    if meant is not None:
        return f"unknown field: did you mean {meant}?"
    return "unknown field: check its spelling (keys are camelCase)"


def _meant_value(item: Any) -> str:
    """`: did you mean 'nvidia'?` after a value that is one of a few words but misspelt."""
    given = item.get("input")
    expected = str((item.get("ctx") or {}).get("expected", ""))
    if not isinstance(given, str):
        return ""
    meant = _near_miss(given, re.findall(r"'([^']*)'", expected))
    return f": did you mean {meant!r}?" if meant is not None else ""


def describe_errors(error: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem: the field path as written in YAML, then what is wrong."""
    return [line for _, line in _described(error, prefix)]


def _described(error: ValidationError, prefix: str = "") -> list[tuple[tuple[Any, ...], str]]:
    """Each problem's loc (in the document) and its line."""
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
            message += f" (got {shown!r}){_meant_value(item)}"
        elif item["type"] in _TYPE_ERRORS:
            message += _what_was_given(shown, item["type"])
        lines.append((tuple(item["loc"]), f"{path or '<document>'}: {message}"))
    return lines
