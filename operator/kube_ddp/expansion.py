"""The kubelet's `$(VAR)` expansion of a container's env, command and args.

The rules are Kubernetes' (third_party/forked/golang/expansion in kubernetes/kubernetes):
`$(NAME)` becomes NAME's value when NAME is defined and stays as written when it is not; `$$`
is one `$`; a `$` before any other character stays as written, as do a trailing `$` and an
unclosed `$(`. An env var's value sees the variables listed before it; command and args see
the whole env. Values from `valueFrom` are taken as they are, never expanded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def expand(text: str, variables: Mapping[str, str]) -> str:
    """`text` with its `$(NAME)` references to `variables` replaced, as the kubelet does it."""
    out: list[str] = []
    cursor = 0
    while cursor < len(text):
        char = text[cursor]
        if char != "$" or cursor + 1 == len(text):
            out.append(char)
            cursor += 1
            continue
        following = text[cursor + 1]
        if following == "$":  # an escaped `$`
            out.append("$")
            cursor += 2
        elif following == "(":
            closer = text.find(")", cursor + 2)
            if closer == -1:  # unclosed: `$(` stays, the rest is read on
                out.append("$(")
                cursor += 2
            else:
                name = text[cursor + 2 : closer]
                out.append(variables.get(name, f"$({name})"))
                cursor = closer + 1
        else:  # `$` not starting a reference: both characters stay
            out.append("$" + following)
            cursor += 2
    return "".join(out)


ValueFrom = Callable[[str, Mapping[str, Any]], str]


def resolve_env(env: Sequence[Mapping[str, Any]], value_from: ValueFrom) -> dict[str, str]:
    """A container's env as its process sees it: in order, each value expanded against the
    variables before it; `value_from(name, source)` resolves a `valueFrom`."""
    resolved: dict[str, str] = {}
    for variable in env:
        name = variable["name"]
        if variable.get("valueFrom") is not None:
            resolved[name] = value_from(name, variable["valueFrom"])
        else:
            resolved[name] = expand(variable.get("value") or "", resolved)
    return resolved


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The container's command followed by its args, both expanded against its env."""
    words = [*container.get("command", []), *container.get("args", [])]
    return [expand(word, env) for word in words]
