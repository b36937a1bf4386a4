"""The repository's own references hold: every path a file names exists in a clone, and the
design document lists the reasons the code writes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_ddp.api import load_job
from kube_ddp.builders import NCCL_WATCHDOG_ENV
from kube_ddp.reasons import PodReason, Reason
from tests.kind.lines import as_run_here, build_arg, dockerfile, kind_lines
from tests.unit.support import EXAMPLES, REPO

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


def test_the_kind_lines_build_the_trainer_on_its_torch_pin() -> None:
    """docs/install.md's kind lines (run by `make test-kind`) build the CPU torch base at the
    trainer's pin, and the trainer on that base."""
    pin = subprocess.run(
        [sys.executable, str(REPO / "hack" / "release.py"), "torch-version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    builds = [line for line in kind_lines() if line[:2] == ["docker", "build"]]
    torch = {dockerfile(b): build_arg(b, "TORCH_VERSION") for b in builds}
    assert torch["trainer_image/torch-cpu.Dockerfile"] == pin, builds
    (trainer,) = [b for b in builds if dockerfile(b) == "trainer_image/Dockerfile"]
    assert build_arg(trainer, "BASE_IMAGE") == f"localhost/torch-cpu:{pin}"


def test_the_kind_tier_runs_the_kind_lines_the_podman_way(tmp_path: Path) -> None:
    """What the Podman paragraph of that section says, as the kind tier applies it."""
    local = {
        "python_bases": {"trainer_image/torch-cpu.Dockerfile": "local/pip"},
        "torch_index": "https://index.invalid/simple",
        "ca_bundle": Path("/ca.crt"),
        "node_image": "local/node",
        "cgroup_v1_config": tmp_path / "v1.yaml",
        "archive": tmp_path / "images.tar",
    }
    run_here = [as_run_here(line, **local) for line in kind_lines()]  # type: ignore[arg-type]
    assert run_here[0] == [
        [*kind_lines()[0], "--image", "local/node", "--config", f"{tmp_path}/v1.yaml"]
    ]
    (load,) = [r for r, line in zip(run_here, kind_lines(), strict=True) if line[1] == "load"]
    assert [command[:3] for command in load] == [
        ["podman", "save", "-m"],
        ["kind", "load", "image-archive"],
    ]
    torch = next(r[0] for r in run_here if "trainer_image/torch-cpu.Dockerfile" in r[0])
    assert torch[:2] == ["podman", "build"]
    for arg in ("PYTHON_IMAGE=local/pip", "TORCH_INDEX=https://index.invalid/simple"):
        assert arg in torch


FENCED_YAML = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
NEEDS_FILES = {"mnist", "fashion-mnist", "cifar10"}  # the datasets the trainer reads from files


def doc_jobs() -> list[tuple[str, dict[str, Any]]]:
    """Every whole DDPTrainingJob in a yaml block of the README or docs/."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in FENCED_YAML.findall(path.read_text()):
            document = yaml.safe_load(block)
            if isinstance(document, dict) and document.get("kind") == "DDPTrainingJob":
                found.append((f"{path.name}: {document['metadata']['name']}", document))
    return found


def example_jobs() -> dict[str, dict[str, Any]]:
    examples = {}
    for path in EXAMPLES:
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "DDPTrainingJob":
                examples[document["metadata"]["name"]] = document
    return examples


def data_problem(document: dict[str, Any]) -> str | None:
    """Why the trainer would find no data: a file dataset neither downloaded nor on a claim."""
    spec = document["spec"]
    trainer = spec.get("trainer") or {}
    if trainer.get("dataset") not in NEEDS_FILES or trainer.get("download"):
        return None
    claims = {
        volume["name"]
        for volume in spec.get("template", {}).get("volumes", [])
        if "persistentVolumeClaim" in volume
    }
    data_dir = trainer.get("dataDir", "")
    for mount in spec.get("template", {}).get("volumeMounts", []):
        if mount["name"] in claims and data_dir.startswith(mount["mountPath"]):
            return None
    return f"{trainer['dataset']} is not downloaded and dataDir {data_dir!r} is on no claim"


def contains(whole: Any, part: Any) -> bool:
    """`part` is `whole` abridged: each of its keys with a value `whole` contains too."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            key in whole and contains(whole[key], value) for key, value in part.items()
        )
    return bool(whole == part)


@pytest.mark.parametrize(("where", "document"), doc_jobs(), ids=lambda value: str(value)[:40])
def test_a_job_printed_in_the_docs_is_valid_finds_its_data_and_matches_its_example(
    where: str, document: dict[str, Any]
) -> None:
    """The README's job trains as printed (it once lacked `download: true`, and exited 78)."""
    load_job(document)
    assert data_problem(document) is None, where
    example = example_jobs().get(document["metadata"]["name"])
    if example is not None:
        assert contains(example["spec"], document["spec"]), f"{where} differs from its example"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_every_example_finds_its_data(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        if document and document.get("kind") == "DDPTrainingJob":
            assert data_problem(document) is None, path.name
