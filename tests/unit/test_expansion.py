"""The kubelet's $(VAR) expansion: references, escapes, what stays literal, and env order."""

from __future__ import annotations

from typing import Any

import pytest

from kube_ddp.expansion import container_argv, expand, resolve_env

VARIABLES = {"VAR_A": "A", "VAR_B": "B", "EMPTY": "", "DOLLAR": "$", "REF": "$(VAR_A)"}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(VAR_A)", "A"),
        ("___$(VAR_B)___", "___B___"),
        ("$(VAR_A)-$(VAR_B)", "A-B"),
        ("$(EMPTY)", ""),
        ("$(UNDEFINED)", "$(UNDEFINED)"),  # an undefined reference stays as written
        ("x$(UNDEFINED)$(VAR_A)", "x$(UNDEFINED)A"),
        ("$$(VAR_A)", "$(VAR_A)"),  # `$$` escapes the reference
        ("$$$(VAR_A)", "$A"),
        ("$$$$(VAR_A)", "$$(VAR_A)"),
        ("$$", "$"),
        ("a$$b", "a$b"),
        ("$", "$"),  # a trailing `$`
        ("text$", "text$"),
        ("$VAR_A", "$VAR_A"),  # shell syntax is not expanded
        ("${VAR_A}", "${VAR_A}"),
        ("$(VAR_A", "$(VAR_A"),  # unclosed
        ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),  # the name runs to the first `)`
        ("$()", "$()"),
        ("$(DOLLAR)(VAR_A)", "$(VAR_A)"),  # values are not expanded again
        ("$(REF)", "$(VAR_A)"),
        ("($(VAR_A))", "(A)"),
        ("--master-addr=$(VAR_A):$(VAR_B)", "--master-addr=A:B"),
        ("ünïcode $(VAR_A) ü$", "ünïcode A ü$"),
        ("", ""),
    ],
)
def test_expand(text: str, expanded: str) -> None:
    assert expand(text, VARIABLES) == expanded


def no_value_from(name: str, source: Any) -> str:
    raise AssertionError(f"unexpected valueFrom for {name}")


def test_env_values_see_only_the_variables_before_them() -> None:
    env = [
        {"name": "MASTER_ADDR", "value": "worker-0"},
        {"name": "URL", "value": "tcp://$(MASTER_ADDR):$(MASTER_PORT)"},  # port comes later
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "AGAIN", "value": "$(MASTER_ADDR):$(MASTER_PORT)"},
        {"name": "MASTER_ADDR", "value": "$(MASTER_ADDR).svc"},  # redefined from its old value
        {"name": "UNSET_VALUE"},
    ]
    assert resolve_env(env, no_value_from) == {
        "MASTER_ADDR": "worker-0.svc",
        "URL": "tcp://worker-0:$(MASTER_PORT)",
        "MASTER_PORT": "29500",
        "AGAIN": "worker-0:29500",
        "UNSET_VALUE": "",
    }


def test_value_from_is_resolved_by_the_caller_and_not_expanded() -> None:
    env = [
        {"name": "A", "value": "a"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "B", "value": "$(POD)/$(A)"},
    ]
    calls = []

    def value_from(name: str, source: Any) -> str:
        calls.append((name, source))
        return "$(A)-pod"

    assert resolve_env(env, value_from) == {"A": "a", "POD": "$(A)-pod", "B": "$(A)-pod/a"}
    assert calls == [("POD", {"fieldRef": {"fieldPath": "metadata.name"}})]


def test_command_and_args_see_the_whole_env() -> None:
    container = {
        "command": ["torchrun", "--master-addr=$(MASTER_ADDR)", "$$(NOT_EXPANDED)"],
        "args": ["--port", "$(MASTER_PORT)", "$(MISSING)"],
    }
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4000"}
    assert container_argv(container, env) == [
        "torchrun",
        "--master-addr=127.0.0.1",
        "$(NOT_EXPANDED)",
        "--port",
        "4000",
        "$(MISSING)",
    ]
