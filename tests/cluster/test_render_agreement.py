"""`kube-ddp render` and the API server agree on every spec: generated specs, valid and broken
(wrong JSON types, nulls, whole and fractional numbers, out-of-range values, cross-field rule
breaks), go to both `render` and a server-side dry run; any disagreement fails. A spec both
refuse must be refused at the same field; a spec both accept must mean the same: the server's
defaulted object reads back as render's.

The dry run receives what `kubectl apply -f` sends for the same file. kubectl re-encodes it
with Go's JSON encoder, which writes a whole float such as `1.0` as `1`, so a whole number is an
integer for every kubectl user (the first test pins this). A client that sends `1.0` itself
meets a server quirk: the schema check accepts it, but a CEL rule that reads the field fails
("expected int, got float64"); render follows kubectl there.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import kubernetes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_ddp import cli, names
from kube_ddp.api import load_job
from tests.cluster.support import Cluster

EXAMPLES = 150  # 50-150 ms each against the local server

# Values of the wrong JSON type, and nulls (the server prunes them: unset, then defaulted).
# Floats are written with a dot: the YAML reader would take `1e+20` for a string.
WRONG_TYPES: st.SearchStrategy[Any] = st.sampled_from(
    ["2", "true", "", "abc", True, False, None, [], {}, 2.5, -0.5]
)


def integers(low: int, high: int) -> st.SearchStrategy[Any]:
    """Integers in and around [low, high], the same as whole floats, and wrong types."""
    edges = st.sampled_from([low - 1, low, high, high + 1])
    valid = st.integers(low, min(high, low + 50))
    return st.one_of(valid, edges, edges.map(float), valid.map(float), WRONG_TYPES)


def one_of_words(*words: str) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(words), st.sampled_from(["Auto", "other"]), WRONG_TYPES)


def optional_fields(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


LABELS = st.dictionaries(
    st.sampled_from(["team", "kubeddp.io/job-name", "tier"]),
    st.one_of(st.sampled_from(["a", "b-1"]), st.none(), st.integers(0, 3)),
    max_size=2,
)
QUANTITY = st.one_of(
    st.sampled_from(["2", "500m", "4Gi", "1.5", "2 cpus", "", "nvidia"]),
    st.integers(0, 8),
    st.sampled_from([2.0, 0.5, True, None]),
)
ENV_VAR = st.one_of(
    optional_fields(
        value=st.one_of(st.sampled_from(["x", "$(MASTER_ADDR)", ""]), WRONG_TYPES),
        valueFrom=st.sampled_from([{"fieldRef": {"fieldPath": "metadata.name"}}, None, "x"]),
    ).flatmap(
        lambda rest: st.sampled_from(["DATA", "MASTER_ADDR", "A=B", "", 3]).map(
            lambda name: {"name": name, **rest}
        )
    ),
    st.none(),
)

SPEC = st.fixed_dictionaries(
    {"nodes": integers(1, 1024)},
    optional={
        "accelerator": st.one_of(
            optional_fields(
                type=one_of_words("cpu", "nvidia", "gaudi", "amd"), perNode=integers(1, 64)
            ),
            st.none(),
        ),
        "nprocPerNode": integers(1, 256),
        "launcher": one_of_words("torchrun", "mpi"),
        "backend": one_of_words("auto", "nccl", "hccl", "gloo"),
        "port": integers(1024, 65535),
        "image": st.one_of(st.sampled_from(["ghcr.io/x/y:1", ""]), WRONG_TYPES),
        "imagePullPolicy": one_of_words("Always", "IfNotPresent", "Never"),
        "trainer": st.one_of(
            optional_fields(
                epochs=integers(1, 1000),
                lr=st.one_of(st.sampled_from([0.1, 1, 0.0, -1.0]), WRONG_TYPES),
                dataset=one_of_words("digits", "mnist", "cifar10"),
                download=st.one_of(st.booleans(), WRONG_TYPES),
                wrnDepth=st.one_of(st.sampled_from([16, 16.0, 17, 10]), WRONG_TYPES),
            ),
            st.none(),
        ),
        "command": st.one_of(
            st.lists(st.one_of(st.sampled_from(["python", "-c", "pass"]), WRONG_TYPES), max_size=3),
            st.none(),
        ),
        "args": st.one_of(st.lists(st.sampled_from(["--x", "1"]), max_size=2), WRONG_TYPES),
        "env": st.one_of(st.lists(ENV_VAR, max_size=2), st.none()),
        "resources": st.one_of(
            optional_fields(limits=st.dictionaries(st.sampled_from(["cpu", "memory"]), QUANTITY)),
            st.none(),
        ),
        "template": st.one_of(
            optional_fields(
                labels=LABELS,
                nodeSelector=LABELS,
                affinity=st.one_of(
                    st.sampled_from([{"nodeAffinity": None}, {"a": 1.0}]), st.none()
                ),
                schedulerName=st.one_of(st.just("volcano"), WRONG_TYPES),
            ),
            st.none(),
        ),
        "elastic": st.one_of(
            optional_fields(minNodes=integers(1, 1024), maxNodes=integers(1, 1024)), st.none()
        ),
        "networkPolicy": st.one_of(
            optional_fields(
                enabled=st.one_of(st.booleans(), WRONG_TYPES),
                ingress=st.one_of(
                    st.lists(st.sampled_from([{"from": []}, {"ports": [{"port": 9090}]}, 3])),
                    WRONG_TYPES,
                ),
            ),
            st.none(),
        ),
        "runPolicy": st.one_of(
            optional_fields(
                backoffLimit=integers(0, 100),
                restartPolicy=one_of_words("OnFailure", "ExitCode", "Never"),
                retryableExitCodes=st.one_of(st.lists(integers(1, 255), max_size=2), st.none()),
                activeDeadlineSeconds=integers(1, 10**6),
                suspend=st.one_of(st.booleans(), WRONG_TYPES),
                cleanPodPolicy=one_of_words("Running", "All", "None"),
            ),
            st.none(),
        ),
    },
)


def job_document(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": "agree", "namespace": "default"},
        "spec": spec,
    }


def render(document: dict[str, Any], path: Path) -> tuple[bool, str]:
    """`kube-ddp render` on the document written as a file: accepted, and its stderr."""
    path.write_text(json.dumps(document))  # JSON is YAML; the reader is render's own
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["render", str(path)])
    assert code in (0, cli.EXIT_USAGE), err.getvalue()
    return code == 0, err.getvalue()


def as_kubectl_sends(value: Any) -> Any:
    """The document as kubectl's JSON encoder writes it: whole floats as integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: as_kubectl_sends(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(item) for item in value]
    return value


def dry_run(cluster: Cluster, document: dict[str, Any]) -> tuple[bool, Any]:
    """A server-side dry run of creating the job, sent as kubectl would send it: accepted,
    and the object or the refusal."""
    try:
        created = cluster.custom_objects.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            "default",
            names.PLURAL,
            as_kubectl_sends(document),
            dry_run="All",
            field_validation="Strict",
        )
    except kubernetes.client.ApiException as error:
        assert error.status in (400, 422), error  # refused as invalid, nothing else
        return False, json.loads(error.body or "{}")
    return True, created


def render_fields(errors: str) -> set[str]:
    """The fields render's lines name (`FILE: spec.nodes: ...`)."""
    return {line.split(": ")[1] for line in errors.splitlines() if line.count(": ") >= 2}


def server_fields(refusal: dict[str, Any]) -> set[str]:
    causes = refusal.get("details", {}).get("causes", [])
    return {cause["field"] for cause in causes if cause.get("field")}


def same_place(one: str, other: str) -> bool:
    """The same field, or one inside the other (`spec.env` holds `spec.env[1]`)."""
    short, long = sorted((one, other), key=len)
    return long == short or long.startswith((short + ".", short + "["))


def test_kubectl_sends_a_whole_float_as_an_integer(
    cluster: Cluster, crd: None, tmp_path: Path
) -> None:
    spec = {"nodes": 1.0, "accelerator": {"type": "nvidia", "perNode": 2.0}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_document(spec)))  # `1.0` and `2.0` in the file
    created = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", str(path))
    assert json.loads(created.stdout)["spec"]["accelerator"]["perNode"] == 2
    assert render(job_document(spec), tmp_path / "job.yaml")[0]


def test_render_and_the_api_server_agree(cluster: Cluster, crd: None, tmp_path: Path) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,  # every run draws afresh; a failure prints its spec
    )
    @given(spec=SPEC)
    def agree(spec: dict[str, Any]) -> None:
        document = job_document(spec)
        rendered, render_errors = render(document, tmp_path / "job.yaml")
        accepted, answer = dry_run(cluster, document)
        assert rendered == accepted, (
            f"render {'accepts' if rendered else 'refuses'} and the API server "
            f"{'accepts' if accepted else 'refuses'} spec {json.dumps(spec)}\n"
            f"render: {render_errors or 'ok'}\n"
            f"server: {answer.get('message') if not accepted else 'ok'}"
        )
        if not accepted:
            # Both refuse: and name the same field (or one inside the other).
            ours, theirs = render_fields(render_errors), server_fields(answer)
            assert any(same_place(a, b) for a in ours for b in theirs), (
                f"spec {json.dumps(spec)}: render names {sorted(ours)}, the server "
                f"{sorted(theirs)}\nrender: {render_errors}server: {answer.get('message')}"
            )
        if accepted:
            # The same job: the server's nulls pruned and defaults applied are render's.
            assert load_job(answer).spec == load_job(document).spec

    agree()
