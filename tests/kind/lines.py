"""docs/install.md's "Trying it on kind" lines, read from the file (never copied into a test),
and how our machines run them: what the section's Podman paragraph says (podman for docker,
images loaded through an archive, cgroup v1's kubelet setting), plus only what cannot be had
here (the node image and the Python bases are made locally, pip through the egress CA)."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

from tests.cluster.support import REPO

INSTALL_MD = REPO / "docs" / "install.md"
SECTION = "\n### Trying it on kind\n"


def kind_lines() -> list[list[str]]:
    """The section's bash block, split as a shell would."""
    section = INSTALL_MD.read_text().split(SECTION, 1)[1].split("\n#", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None, f"docs/install.md's {SECTION.strip()} has no ```bash block"
    lines = [line.strip() for line in block.group(1).splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def build_arg(command: list[str], name: str) -> str | None:
    """The value a `docker build` line gives its build argument `name`."""
    for flag, value in itertools.pairwise(command):
        if flag == "--build-arg" and value.startswith(f"{name}="):
            return value.split("=", 1)[1]
    return None


def dockerfile(command: list[str]) -> str:
    return command[command.index("-f") + 1] if "-f" in command else "Dockerfile"


def as_run_here(
    command: list[str],
    *,
    python_bases: dict[str, str],
    torch_index: str,
    ca_bundle: Path,
    node_image: str,
    cgroup_v1_config: Path,
    archive: Path,
) -> list[list[str]]:
    """The commands our machines run for one line of the section."""
    if command[0] == "docker" and command[1] == "build":
        local = ["--network", "host", "--volume", f"{ca_bundle}:{ca_bundle}:ro"]
        base = python_bases.get(dockerfile(command))
        if base is not None:
            local += ["--build-arg", f"PYTHON_IMAGE={base}"]
        if build_arg(command, "TORCH_VERSION") is not None:
            local += ["--build-arg", f"TORCH_INDEX={torch_index}"]
        return [["podman", "build", *local, *command[2:]]]
    if command[:3] == ["kind", "load", "docker-image"]:
        args = command[3:]
        name = args[args.index("--name") + 1]
        images = [arg for arg in args if arg not in ("--name", name)]
        return [
            ["podman", "save", "-m", "-o", str(archive), *images],
            ["kind", "load", "image-archive", str(archive), "--name", name],
        ]
    if command[:3] == ["kind", "create", "cluster"]:
        return [[*command, "--image", node_image, "--config", str(cgroup_v1_config)]]
    return [command]
