"""A job's own command as tutorials write it: a launcher line that would fight kube-ddp's own,
or a shell variable nothing expands, is refused by `render` (and the operator) with the line
to write; a launcher line that agrees with the job runs as written."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from kube_ddp import own_command
from kube_ddp.cli import main

# The torchrun tutorial's launch line, pasted into a job of two pods.
PASTED = [
    "torchrun",
    "--nnodes=2",
    "--nproc_per_node=2",
    "--rdzv_id=100",
    "--rdzv_backend=c10d",
    "--rdzv_endpoint=$HOSTNAME:3000",
    "main.py",
    "--epochs",
    "3",
]


def render_spec(capsys: pytest.CaptureFixture[str], write_job, spec: dict[str, Any]) -> str:
    """What `kube-ddp render` says of a job file with `spec`; it must refuse it (exit 2)."""
    document = {
        "apiVersion": "kubeddp.io/v1alpha1",
        "kind": "DDPTrainingJob",
        "metadata": {"name": "mine"},
        "spec": spec,
    }
    path = write_job(yaml.safe_dump(document))
    code = main(["render", path])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    return re.sub(r"^.*?:\d+:\d+: ", "job.yaml: ", err, flags=re.M)  # the line: test_cli's


def test_the_tutorials_torchrun_line_is_refused_with_the_line_to_write(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    said = render_spec(capsys, write_job, {"nodes": 2, "command": PASTED})
    assert said == (
        "job.yaml: spec: command sets --nproc-per-node=2 (the job has spec.nprocPerNode: 1), "
        "--rdzv-endpoint=$HOSTNAME:3000, against what kube-ddp gives every pod (torchrun's "
        'counts and rendezvous): write command: ["python", "main.py", "--epochs", "3"] (no '
        "args) and set spec.nodes: 2, spec.nprocPerNode: 2; kube-ddp then starts torchrun for "
        "it with the job's rendezvous\n"
    )


@pytest.mark.parametrize(
    ("command", "fix"),
    [
        (["torchrun", "--standalone", "-m", "pkg.train"], '["python", "-m", "pkg.train"]'),
        (["torchrun", "--no-python", "--node_rank", "0", "./train"], '["./train"]'),
        (
            ["python3", "-u", "-m", "torch.distributed.run", "--master-addr=10.0.0.1", "t.py"],
            "t.py",
        ),
        (["torchrun", "--nnodes", "1:4", "t.py"], "spec.elastic: {minNodes: 1, maxNodes: 4}"),
    ],
)
def test_each_torchrun_form_is_read(
    capsys: pytest.CaptureFixture[str], write_job, command: list[str], fix: str
) -> None:
    assert fix in render_spec(capsys, write_job, {"nodes": 2, "command": command})


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (
            {"nodes": 2, "launcher": "mpi", "command": ["mpirun", "-np", "8", "python", "t.py"]},
            "command starts mpirun, but launcher: mpi runs mpirun itself, one rank a process "
            "(-np 2: spec.nodes x nprocPerNode)",
        ),
        (
            {"nodes": 2, "command": ["horovodrun", "-np", "2", "python", "t.py"]},
            "command starts horovodrun in each of the 2 pods, each its own group: set launcher: "
            "mpi",
        ),
        ({"nodes": 1, "command": ["srun", "python", "t.py"]}, "command starts srun"),
    ],
)
def test_an_mpi_or_slurm_line_is_refused_naming_the_launcher_to_set(
    capsys: pytest.CaptureFixture[str], write_job, spec: dict[str, Any], said: str
) -> None:
    assert said in render_spec(capsys, write_job, spec)


def test_a_shell_variable_in_a_command_is_named_as_not_expanded(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    spec = {"nodes": 1, "command": ["python", "t.py"], "args": ["--out=/data/${USER}/run"]}
    assert render_spec(capsys, write_job, spec) == (
        "job.yaml: spec: args[0] holds ${USER}, which nothing expands: no shell runs the "
        "command. Write $(USER) for a variable of the container's env (the kubelet fills it "
        "in), run it as [sh, -c, '...'], or $$USER for the text itself\n"
    )


@pytest.mark.parametrize(
    "spec",
    [
        {
            "nodes": 2,
            "nprocPerNode": 2,
            "command": ["torchrun", "--nnodes=2", "--nproc_per_node=2", "t.py"],
        },
        {
            "nodes": 2,
            "command": [
                "torchrun",
                "--master-addr=$(MASTER_ADDR)",
                "--node-rank=$(NODE_RANK)",
                "t.py",
            ],
        },
        {
            "nodes": 1,
            "command": ["torchrun", "--standalone", "--rdzv-endpoint=localhost:0", "t.py"],
        },
        {"nodes": 2, "command": ["sh", "-c", "torchrun --rdzv-endpoint=$HOSTNAME:3000 t.py"]},
        {"nodes": 2, "command": ["python", "t.py", "--price=$5", "--end=x$", "$$HOME", "$(RANK)"]},
        {"nodes": 1, "command": ["mpirun", "-np", "2", "python", "t.py"]},
    ],
)
def test_a_command_that_agrees_with_the_job_renders(
    capsys: pytest.CaptureFixture[str], write_job, spec: dict[str, Any]
) -> None:
    document = {"apiVersion": "kubeddp.io/v1alpha1", "kind": "DDPTrainingJob"}
    path = write_job(yaml.safe_dump({**document, "metadata": {"name": "ok"}, "spec": spec}))
    code = main(["render", path])
    assert (code, capsys.readouterr().err.count("spec:")) == (0, 0)


def test_the_switches_are_torchruns_own() -> None:
    """torchrun's options that take no value, as the installed torch's parser has them: a
    switch read as taking a value would take the script's name for it."""
    from torch.distributed.run import get_args_parser

    switches = {
        option.lstrip("-").replace("_", "-")
        for action in get_args_parser()._actions  # no public list of a parser's options
        if action.nargs == 0
        for option in action.option_strings
        if option.startswith("--")
    }
    assert switches == own_command.TORCHRUN_SWITCHES


@pytest.mark.parametrize(
    ("command", "script"),
    [
        (["python", "train.py", "--x"], "train.py"),
        (["python3", "-u", "-W", "ignore", "src/train.py"], "src/train.py"),
        (["python", "-m", "pkg.train"], None),
        (["python", "-c", "pass"], None),
        (["torchrun", "--nproc-per-node", "2", "main.py"], "main.py"),
        (["python", "-m", "torch.distributed.run", "-m", "pkg"], None),
        (["./run.sh", "a"], "./run.sh"),
        (["/opt/run.sh"], None),
        (["deepspeed", "train.py"], None),
    ],
)
def test_the_script_a_command_runs(command: list[str], script: str | None) -> None:
    assert own_command.script_of(command) == script


def test_a_torchrun_line_that_goes_on_in_args_is_read_whole(
    capsys: pytest.CaptureFixture[str], write_job
) -> None:
    spec = {"nodes": 2, "command": ["torchrun"], "args": ["--rdzv_endpoint=h:1", "main.py", "-x"]}
    said = render_spec(capsys, write_job, spec)
    assert 'write command: ["python", "main.py", "-x"] (no args)' in said
