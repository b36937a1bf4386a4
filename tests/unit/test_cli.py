"""`kube-ddp crd` and `kube-ddp render`: the operator's objects, or clear errors and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_ddp.cli import main
from tests.unit.support import EXAMPLES, REPO, validate_strict

BAR = """\
apiVersion: kubeddp.io/v1alpha1
kind: DDPTrainingJob
metadata:
  name: bar
spec:
  nodes: 2
  accelerator: {type: nvidia, perNode: 8}
"""


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[Any], str]:
    code = main(["render", *argv])
    out, err = capsys.readouterr()
    return code, [d for d in yaml.safe_load_all(out) if d] if out else [], err


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def image_note(job: str, what: str) -> str:
    return (
        f"kube-ddp: {job}: {what} runs in ghcr.io/kube-ddp/ddp-trainer:0.1.0, the operator's "
        "cuda trainer image (spec.image unset; the operator's --trainer-image, the chart's "
        "operator.trainerImage)\n"
        f"kube-ddp: {job}: its pods meet the restricted Pod Security Standard\n"
    )


def test_render_bar_in_ns1(capsys: pytest.CaptureFixture[str], write_job) -> None:
    code, objects, err = render(capsys, write_job(BAR), "--namespace", "ns1")
    assert (code, err) == (0, image_note("bar", "the trainer"))
    service = objects[0]
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] == "Service"] == [
        ("Service", "bar")
    ]
    assert service["spec"]["clusterIP"] == "None"
    assert [p["metadata"]["name"] for p in pods] == ["bar-worker-0", "bar-worker-1"]
    for rank, pod in enumerate(pods):
        assert env(pod)["WORLD_SIZE"] == "16"
        assert env(pod)["MASTER_ADDR"] == "bar-worker-0.bar.ns1.svc"
        assert env(pod)["PET_NNODES"] == "2"
        assert env(pod)["NODE_RANK"] == str(rank)
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_every_example_renders_valid_objects(
    capsys: pytest.CaptureFixture[str], example: Path
) -> None:
    code, objects, err = render(capsys, str(example))
    assert code == 0
    assert all(
        any(note in line for note in (" runs in ", " Pod Security Standard", " Workload "))
        for line in err.splitlines()
    ), err
    for obj in objects:
        if obj["kind"] == "MPIJob":
            for replica in obj["spec"]["mpiReplicaSpecs"].values():
                validate_strict({"apiVersion": "v1", "kind": "Pod", **replica["template"]})
        else:
            validate_strict(obj)


BAD = [
    (
        "unknown field, wrong type, reserved env, broken rule",
        """\
apiVersion: kubeddp.io/v1alpha1
kind: DDPTrainingJob
metadata: {name: bad}
spec:
  nodes: many
  acelerator: {type: nvidia}
  env: [{name: MASTER_ADDR, value: x}]
  elastic: {minNodes: 4, maxNodes: 2}
""",
        [
            "spec.nodes: Input should be a valid integer",
            "spec.acelerator: unknown field",
            "spec.env[0]: MASTER_ADDR is reserved",
            "spec.elastic: minNodes must not exceed maxNodes",
        ],
    ),
    ("not YAML", "spec: [unclosed\n", ["not valid YAML: line 2, column 1: expected ','"]),
    ("empty", "", ["no DDPTrainingJob in the file"]),
    ("a list", "- 1\n- 2\n", ["expected a DDPTrainingJob mapping"]),
    (
        "aliases that expand past the bound",
        "apiVersion: kubeddp.io/v1alpha1\nkind: DDPTrainingJob\n"
        + "".join(
            f"x{i}: &x{i} [{', '.join([f'*x{i - 1}' if i else '1'] * 9)}]\n" for i in range(9)
        ),
        ["not valid YAML: line 1: the document holds more than 100000 values once its aliases"],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_one_line_per_problem(
    capsys: pytest.CaptureFixture[str], write_job, text: str, expected: list[str]
) -> None:
    path = write_job(text)
    code, objects, err = render(capsys, path)
    assert (code, objects) == (2, [])
    lines = err.strip().splitlines()
    assert len(lines) == len(expected), err
    assert all(line.startswith(path + ":") for line in lines)
    for fragment in expected:
        assert sum(fragment in line for line in lines) == 1, (fragment, lines)


def test_a_few_aliases_are_a_job_file_as_any(capsys: pytest.CaptureFixture[str], write_job) -> None:
    anchored = BAR.replace("nodes: 2", "nodes: &n 2\n  elastic: {minNodes: 1, maxNodes: *n}")
    code, objects, err = render(capsys, write_job(anchored))
    assert code == 0, err
    assert sum(o["kind"] == "Pod" for o in objects) == 2


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = render(capsys, str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "nope.yaml: cannot read: No such file or directory" in err


def test_several_jobs_in_one_file(capsys: pytest.CaptureFixture[str], write_job) -> None:
    second = BAR.replace("name: bar", "name: baz").replace("nodes: 2", "nodes: 1")
    code, objects, _ = render(capsys, write_job(BAR + "---\n" + second))
    assert code == 0
    assert [o["metadata"]["name"] for o in objects if o["kind"] in ("Service", "Pod")] == [
        "bar",
        "bar-worker-0",
        "bar-worker-1",
        "baz",
        "baz-worker-0",
    ]


def test_crd_command_prints_the_committed_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == yaml.safe_load((REPO / "manifests" / "crd.yaml").read_text())


def test_console_script_reads_stdin_and_never_shows_a_traceback() -> None:
    script = Path(sys.executable).with_name("kube-ddp")
    bad = BAR.replace("nodes: 2", "nodes: -1")
    result = subprocess.run(
        [str(script), "render", "-"], input=bad, capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert result.stderr == "-:6:3: spec.nodes: Input should be greater than or equal to 1\n"
    good = subprocess.run(
        [str(script), "render", "-", "-n", "x"],
        input=BAR,
        capture_output=True,
        text=True,
        check=False,
    )
    assert good.returncode == 0
    assert "bar-worker-1.bar" not in good.stdout  # MASTER_ADDR is always worker 0
    assert "bar-worker-0.bar.x.svc" in good.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_render_writes_no_yaml_aliases(capsys: pytest.CaptureFixture[str], example: Path) -> None:
    """Users copy what render prints: `&id001` / `*id001` would make them chase references."""
    assert main(["render", str(example)]) == 0
    out = capsys.readouterr().out
    events = list(yaml.parse(out))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent)]
    assert not [e for e in events if getattr(e, "anchor", None)]


def test_render_says_which_image_a_command_runs_in(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    own = BAR + "  command: [python, train.py]\n"
    assert render(capsys, write_job(own))[2] == image_note("bar", "its command")
    assert " runs in " not in render(capsys, write_job(own + "  image: me/train:1\n"))[2]


def test_render_and_operator_name_the_trainer_image_alike(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    code, objects, _ = render(capsys, write_job(BAR), "--trainer-image", "registry.local/t:1")
    assert code == 0
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {"registry.local/t:1"}
    with pytest.raises(SystemExit):
        main(["operator", "--trainer-image", "x", "--help"])
    assert "--trainer-image" in capsys.readouterr().out


def test_render_takes_an_mpi_job_with_a_queue(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    queued_mpi = BAR.replace(
        "  name: bar\n", "  name: bar\n  labels: {kueue.x-k8s.io/queue-name: team}\n"
    ).replace("nvidia, perNode: 8}", "gaudi, perNode: 8}\n  launcher: mpi")
    code, objects, _ = render(capsys, write_job(queued_mpi))
    assert code == 0
    assert "MPIJob" in {o["kind"] for o in objects}


def test_render_says_a_gaudi_job_needs_an_image_of_its_own(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    gaudi = BAR.replace("nvidia, perNode: 8}", "gaudi, perNode: 8}")
    _, _, said = render(capsys, write_job(gaudi))
    assert "no release image carries the torch of gaudi: set spec.image" in said
    assert "no release image" not in render(capsys, write_job(BAR))[2]


def test_render_says_a_topology_job_s_workload_name_is_not_the_cluster_s(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    """Kueue names the Workload by a hash of the job's uid, which a file has not."""
    racked = (
        BAR.replace("  name: bar\n", "  name: bar\n  labels: {kueue.x-k8s.io/queue-name: racked}\n")
        + "  scheduling: {topology: {level: topology.kubeddp.io/rack}}\n"
    )
    code, _, said = render(capsys, write_job(racked))
    assert code == 0
    assert "kueue.x-k8s.io/workload ends with a hash of the job's uid" in said
    assert "hash of the job's uid" not in render(capsys, write_job(BAR))[2]


def test_a_misspelt_key_or_word_is_placed_and_its_near_miss_named(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    """The file's line and column of each problem, and "did you mean" where one key or word
    of the field's is close (a case slip or a typo), as a user's editor would jump to it."""
    text = """\
apiVersion: kubeddp.io/v1alpha1
kind: DDPTrainingJob
metadata: {name: typo}
spec:
  nodes: 2
  accelerator: {type: nvdia, perNode: 1}
  trainer:
    batchsize: 64
  envv: []
"""
    path = write_job(text)
    code, _, err = render(capsys, path)
    assert code == 2
    assert sorted(err.splitlines()) == [
        f"{path}:6:17: spec.accelerator.type: Input should be 'nvidia', 'gaudi', 'amd' or "
        "'cpu' (got 'nvdia'): did you mean 'nvidia'?",
        f"{path}:8:5: spec.trainer.batchsize: unknown field: did you mean batchSize?",
        f"{path}:9:3: spec.envv: unknown field: did you mean env?",
    ]
