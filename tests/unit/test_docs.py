"""The repository's own references hold: every path a file names exists in a clone, and the
design document lists the reasons the code writes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from kube_ddp.builders import NCCL_WATCHDOG_ENV
from kube_ddp.reasons import PodReason, Reason
from tests.unit.support import REPO

# Top-level folders a reference to a repository path starts with.
TOP = (
    "docs",
    "hack",
    "operator",
    "trainer_image",
    "tests",
    "manifests",
    "charts",
    "benchmarks",
    "shared",
)
PATH_LIKE = re.compile(
    r"(?<![\w./-])((?:\.\./)*(?:" + "|".join(TOP) + r")/[\w./-]*[\w-]|[\w-]+\.md)(?![\w/])"
)
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".txt", ".json", ".tpl"}
TEXT_NAMES = {"Makefile", "Dockerfile", ".gitignore"}


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO / name for name in listed if (REPO / name).is_file()]


def text_files() -> list[Path]:
    return [
        path
        for path in tracked_files()
        if (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES) and path.name != "uv.lock"
    ]


def exists(reference: str, source: Path, basenames: set[str]) -> bool:
    if "/" not in reference:  # a bare file name, such as README.md
        return reference in basenames
    candidates = [REPO / reference, source.parent / reference]
    return any(c.exists() for c in candidates)


def test_every_referenced_path_exists() -> None:
    files = text_files()
    basenames = {path.name for path in tracked_files()}
    missing = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for reference in PATH_LIKE.findall(line):
                if any(c in reference for c in "<>*{}$"):  # a pattern, not a path
                    continue
                if not exists(reference.rstrip("."), path, basenames):
                    missing.append(f"{path.relative_to(REPO)}:{number}: {reference}")
    assert not missing, "references to files a clone does not have:\n" + "\n".join(missing)


@pytest.mark.parametrize("vocabulary", [Reason, PodReason], ids=lambda v: v.__name__)
def test_the_design_lists_every_reason(vocabulary: type[Reason] | type[PodReason]) -> None:
    design = (REPO / "docs" / "design.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \|", design, flags=re.MULTILINE))
    assert {reason.value for reason in vocabulary} <= listed


def test_the_gaudi_example_names_the_image_install_md_builds_with_mpi() -> None:
    """manifests/examples/gaudi-mpi.yaml runs mpirun and sshd: its image is the trainer's MPI
    variant on Intel's base, built by the command docs/install.md gives (and its header)."""
    example = REPO / "manifests" / "examples" / "gaudi-mpi.yaml"
    image = yaml.safe_load(example.read_text())["spec"]["image"]
    builds = re.findall(
        r"docker build -f trainer_image/Dockerfile ((?:[^\n]*\\\n)*[^\n]*)",
        (REPO / "docs" / "install.md").read_text() + example.read_text().replace("\n#", "\n"),
    )
    for_the_example = [b for b in builds if b.rstrip(" .").endswith(f"-t {image}")]
    assert len(for_the_example) == 2, builds  # install.md's and the example's own header
    for build in for_the_example:
        assert "--build-arg WITH_MPI=true" in build
        assert "--build-arg BASE_IMAGE=vault.habana.ai/gaudi-docker/" in build


def test_the_design_lists_every_watchdog_setting_with_its_value() -> None:
    design = (REPO / "docs" / "design.md").read_text()
    for name, value in NCCL_WATCHDOG_ENV.items():
        assert f"| `{name}` | {value} |" in design, name
