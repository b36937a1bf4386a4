"""A job's own `command` as users paste it from a tutorial: the launcher lines that would
fight kube-ddp's own, and shell variables that nothing expands (no shell runs the command;
the kubelet expands only `$(NAME)`). Pure: what to say, never what to run.

A command that starts a launcher runs as written (docs/design.md, "What a pod runs"), so it
must not contradict the job: torchrun's group flags (the counts, the node's rank, the
rendezvous) come to every pod from kube-ddp as PET_* variables, and a literal flag overrides
them; MPI's launcher already runs mpirun; srun needs Slurm's daemons, which pods have not.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence

from ddp_trainer import contract

# Programs that start the ranks themselves: a command starting with one is run as written.
LAUNCHERS = frozenset({"torchrun", "mpirun", "mpiexec", "horovodrun", "deepspeed", "accelerate"})
LAUNCHER_MODULES = frozenset(
    {"torch.distributed.run", "torch.distributed.launch", contract.TORCHRUN_MODULE}
)
SHELLS = frozenset({"sh", "bash", "dash", "zsh"})
TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
MPI_LAUNCHERS = frozenset({"mpirun", "mpiexec", "horovodrun"})

# torchrun's options that take no value (torch.distributed.run's get_args_parser; a unit test
# compares this with the installed torch's parser), written with dashes.
TORCHRUN_SWITCHES = frozenset(
    {"standalone", "module", "no-python", "run-path", "virtual-local-rank", "help"}
)
_SHORT = {"m": "module", "h": "help", "r": "redirects", "t": "tee"}
# torchrun's options that kube-ddp sets for every pod, and the spec field each follows.
_COUNTS = {"nnodes": "spec.nodes", "nproc-per-node": "spec.nprocPerNode"}
_RENDEZVOUS = ("rdzv-endpoint", "master-addr", "master-port", "node-rank", "standalone")

# A `$NAME` or `${NAME}` that no one expands: a `$` not escaped (`$$`) and not `$(`.
_SHELL_VARIABLE = re.compile(r"(?<!\$)(?:\$\$)*(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)")


def program(command: Sequence[str]) -> str:
    return command[0].rsplit("/", 1)[-1] if command else ""


def _runs_a_shell_script(command: Sequence[str]) -> bool:
    return program(command) in SHELLS and "-c" in command


def starts_a_launcher(command: Sequence[str]) -> bool:
    """Whether `command` starts its own ranks: torchrun, mpirun (or another launcher), `python
    -m torch.distributed.run`, or a shell script (`sh -c ...`) that names one of them."""
    name = program(command)
    if name in LAUNCHERS:
        return True
    if name.startswith("python"):
        return any(
            flag == "-m" and module in LAUNCHER_MODULES
            for flag, module in itertools.pairwise(command)
        )
    if _runs_a_shell_script(command):
        script = " ".join(command[command.index("-c") + 1 :])
        words = set(script.replace(";", " ").replace("&", " ").replace("|", " ").split())
        return bool(words & (LAUNCHERS | LAUNCHER_MODULES))
    return False


def _torchrun_words(command: Sequence[str]) -> list[str] | None:
    """The words after `torchrun` (or `python -m torch.distributed.run`), or None when the
    command does not start torchrun."""
    name = program(command)
    if name == "torchrun":
        return list(command[1:])
    if name.startswith("python"):
        for at, (flag, module) in enumerate(itertools.pairwise(command)):
            if flag == "-m":
                return list(command[at + 2 :]) if module in TORCHRUN_MODULES else None
    return None


def _torchrun_options(words: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """torchrun's options as written (name with dashes: value, None for a switch) and the
    words from the script on."""
    options: dict[str, str | None] = {}
    rest = list(words)
    while rest and rest[0].startswith("-") and rest[0] != "--":
        word = rest.pop(0)
        name, equals, value = word.lstrip("-").partition("=")
        name = _SHORT.get(name, name).replace("_", "-")
        if equals:
            options[name] = value
        elif name in TORCHRUN_SWITCHES:
            options[name] = None
        else:
            options[name] = rest.pop(0) if rest else ""
    if rest and rest[0] == "--":
        rest.pop(0)
    return options, rest


def _from_the_env(value: str | None) -> bool:
    """A value that names the env contract (`$(MASTER_ADDR)`): the kubelet fills it in."""
    return value is not None and "$(" in value


def _line(words: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(w) for w in words) + "]"


def _torchrun_problems(
    words: list[str], *, nnodes: str, procs_per_node: int, pods: int
) -> list[str]:
    options, script = _torchrun_options(words)
    found = []
    for flag, field in _COUNTS.items():
        value = options.get(flag)
        given = nnodes if flag == "nnodes" else str(procs_per_node)
        if flag in options and value != given and not _from_the_env(value):
            found.append(f"--{flag}={value} (the job has {field}: {given})")
    if pods > 1:
        for flag in _RENDEZVOUS:
            if flag in options and not _from_the_env(options[flag]):
                value = options[flag]
                found.append(f"--{flag}" + (f"={value}" if value is not None else ""))
    if not found:
        return []
    if not script:
        own = ["python", "train.py"]
    elif "no-python" in options:
        own = script
    elif "module" in options:
        own = ["python", "-m", *script]
    else:
        own = ["python", *script]
    return [
        f"command sets {', '.join(found)}, against what kube-ddp gives every pod (torchrun's "
        f"counts and rendezvous): write command: {_line(own)} (no args) and "
        f"set {_settings(options, nnodes)}; kube-ddp then starts torchrun for it with the "
        "job's rendezvous"
    ]


def _settings(options: dict[str, str | None], nnodes: str) -> str:
    """The spec fields that give the group the counts torchrun's options asked for."""
    nodes = options.get("nnodes") or nnodes
    low, colon, high = nodes.partition(":")
    settings = [
        f"spec.elastic: {{minNodes: {low}, maxNodes: {high}}}" if colon else f"spec.nodes: {nodes}"
    ]
    per_node = options.get("nproc-per-node")
    if per_node and per_node.isdigit():
        settings.append(f"spec.nprocPerNode: {per_node}")
    elif per_node:  # gpu, auto: one process an accelerator, kube-ddp's default
        settings.append("no spec.nprocPerNode (one process an accelerator)")
    return ", ".join(settings)


def launcher_problems(
    command: Sequence[str], *, launcher: str, nnodes: str, procs_per_node: int, pods: int
) -> list[str]:
    """Why a command that starts a launcher cannot run in this job as written (none: it can).
    `command` is the command with its args; `nnodes` the node count torchrun gets ("2", or
    "1:3" elastic), `pods` the most pods."""
    name = program(command)
    if name == "srun":
        return [
            "command starts srun, which needs Slurm's daemons; pods have none: write the "
            "program srun runs (command: [python, train.py]) and set spec.nodes and "
            "nprocPerNode from --nodes and --ntasks-per-node (docs/mpi.md, Slurm)"
        ]
    if launcher == "mpi" and starts_a_launcher(command):
        return [
            f"command starts {name}, but launcher: mpi runs mpirun itself, one rank a process "
            f"(-np {pods * procs_per_node}: spec.nodes x nprocPerNode): "
            "write the program mpirun runs (command: [python, train.py])"
        ]
    if launcher == "torchrun" and name in MPI_LAUNCHERS and pods > 1:
        return [
            f"command starts {name} in each of the {pods} pods, each its own group: set "
            "launcher: mpi and write the program it runs (command: [python, train.py])"
        ]
    words = _torchrun_words(command)
    if launcher != "torchrun" or words is None:
        return []
    return _torchrun_problems(words, nnodes=nnodes, procs_per_node=procs_per_node, pods=pods)


# python's options that take a value; -c and -m end the options with no script file.
_PYTHON_VALUED = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def script_of(command: Sequence[str]) -> str | None:
    """The file a command runs, where it names one: python's script, torchrun's, or a
    program given by a relative path (`./train.sh`). None for a module, `-c` code or a
    program found on PATH."""
    torchrun = _torchrun_words(command)
    if torchrun is not None:
        options, script = _torchrun_options(torchrun)
        return script[0] if script and "module" not in options else None
    if program(command).startswith("python"):
        words = list(command[1:])
        while words and words[0].startswith("-"):
            flag = words.pop(0)
            if flag in ("-c", "-m") or flag.startswith(("-c", "-m")):
                return None
            if flag in _PYTHON_VALUED and words:
                words.pop(0)
        return words[0] if words else None
    if command and "/" in command[0] and not command[0].startswith("/"):
        return command[0]
    return None


def unexpanded_variables(command: Sequence[str], args: Sequence[str]) -> list[str]:
    """Each `$NAME` in the command and its args that stays as written: no shell runs them."""
    if _runs_a_shell_script(command):
        return []
    found = []
    for field, words in (("command", command), ("args", args)):
        for index, word in enumerate(words):
            for match in _SHELL_VARIABLE.finditer(word):
                name = match.group(1).strip("${}")
                found.append(
                    f"{field}[{index}] holds {match.group(1)}, which nothing expands: no shell "
                    f"runs the command. Write $({name}) for a variable of the container's env "
                    "(the kubelet fills it in), run it as [sh, -c, '...'], or "
                    f"$${name} for the text itself"
                )
    return found
