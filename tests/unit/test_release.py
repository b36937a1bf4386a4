"""The release's version check (hack/release.py): one version, a tag that agrees, its notes."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kube_ddp import names
from tests.unit.support import REPO, load_hack_script

RELEASE = load_hack_script("release")
sys.path.insert(0, str(REPO / "hack"))
DEV_CLUSTER_BUILD = importlib.import_module("devcluster.build")
VERSION = RELEASE.version()
# What the check reads: the version's home and every copy of it.
CHECKED_FILES = (
    "operator/pyproject.toml",
    "trainer_image/pyproject.toml",
    "charts/kube-ddp/Chart.yaml",
    "Dockerfile",
    "trainer_image/Dockerfile",
    "CHANGELOG.md",
)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    for name in CHECKED_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def test_the_repository_agrees_with_its_tag() -> None:
    assert RELEASE.version_problems(REPO, tag=f"v{VERSION}") == []


@pytest.mark.parametrize("tag", ["v9.9.9", VERSION, f"v{VERSION}-rc.1"])
def test_a_tag_that_disagrees_fails(tag: str) -> None:
    assert RELEASE.version_problems(REPO, tag=tag) == [
        f"tag {tag} is not v{VERSION} (operator/pyproject.toml): tag v{VERSION}, or set the "
        "version in operator/pyproject.toml and run `make manifests`"
    ]


@pytest.mark.parametrize(
    ("path", "where"),
    [
        ("trainer_image/pyproject.toml", "trainer_image/pyproject.toml"),
        ("charts/kube-ddp/Chart.yaml", "charts/kube-ddp/Chart.yaml version"),
        ("trainer_image/Dockerfile", "trainer_image/Dockerfile ARG VERSION"),
    ],
)
def test_a_copy_that_disagrees_is_named(clone: Path, path: str, where: str) -> None:
    file = clone / path
    text = file.read_text()
    file.write_text(text.replace(VERSION, "7.7.7", 1))
    problems = RELEASE.version_problems(clone)
    assert [p for p in problems if p.startswith(f"{where} says 7.7.7,")], problems


def test_a_new_version_needs_its_changelog_section(clone: Path) -> None:
    for name in CHECKED_FILES[:-1]:
        file = clone / name
        file.write_text(file.read_text().replace(VERSION, "7.7.7"))
    assert RELEASE.version_problems(clone, tag="v7.7.7") == [
        "CHANGELOG.md has no `## 7.7.7` section: the release notes"
    ]


def test_release_notes_are_the_section_of_the_version() -> None:
    text = "# Changelog\n\n## [0.3.0] - 2027-01-02\n\n- three\n\n## 0.2.0\n\n- two\n"
    assert RELEASE.release_notes(text, "0.3.0") == "- three\n"
    assert RELEASE.release_notes(text, "0.2.0") == "- two\n"
    assert RELEASE.release_notes(text, "0.1.0") is None


def test_the_command_fails_on_a_disagreeing_tag() -> None:
    tool = [sys.executable, str(REPO / "hack/release.py")]
    good, bad = (
        subprocess.run(
            [*tool, "check-version", f"--tag={tag}"], capture_output=True, text=True, check=False
        )
        for tag in (f"v{VERSION}", "v9.9.9")
    )
    assert good.returncode == 0, good.stderr
    assert bad.returncode == 1
    assert "tag v9.9.9 is not" in bad.stderr


WORKFLOW = yaml.safe_load((REPO / ".github/workflows/release.yaml").read_text())


def workflow_runs() -> list[str]:
    return [s.get("run", "") for job in WORKFLOW["jobs"].values() for s in job["steps"]]


def test_the_workflow_checks_the_tag_before_it_builds() -> None:
    checks = [r for r in workflow_runs() if "hack/release.py check-version" in r]
    assert checks == ['python hack/release.py check-version --tag "$GITHUB_REF_NAME"']
    assert all("version" in job.get("needs", ["version"]) for job in WORKFLOW["jobs"].values())


def test_the_workflow_publishes_what_the_chart_and_operator_name() -> None:
    jobs = WORKFLOW["jobs"]
    values = yaml.safe_load((REPO / "charts/kube-ddp/values.yaml").read_text())
    assert jobs["operator-image"]["env"]["IMAGE"] == values["image"]["repository"]
    assert jobs["trainer-images"]["env"]["IMAGE"] == names.TRAINER_REPOSITORY
    variants = {v["variant"] for v in jobs["trainer-images"]["strategy"]["matrix"]["include"]}
    assert variants == {"cuda", "cpu", "mpi"}
    assert WORKFLOW["env"]["HELM_VERSION"] == DEV_CLUSTER_BUILD.HELM_VERSION


def test_the_cpu_base_installs_the_torchvision_of_the_trainers_torch_extra() -> None:
    """torchvision's pin has its home in the trainer's [torch] extra; the CPU base's default
    (the release builds it with TORCH_VERSION only) is a copy kept in step here."""
    extra = tomllib.loads((REPO / "trainer_image" / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["torch"]
    [pin] = [r.split("==", 1)[1] for r in extra if r.startswith("torchvision==")]
    dockerfile = (REPO / "trainer_image" / "torch-cpu.Dockerfile").read_text()
    assert re.search(r"^ARG TORCHVISION_VERSION=(\S+)$", dockerfile, re.M)[1] == pin  # type: ignore[index]
    assert '"torchvision==${TORCHVISION_VERSION}"' in dockerfile
