#!/usr/bin/env python3
"""The release's local half: the version check, the release notes, and `make release-check`.

    release.py version                  print the version (operator/pyproject.toml)
    release.py check-version [--tag T]  exit 1 naming every copy (or tag T) that disagrees
    release.py notes                    print the CHANGELOG.md section of the version
    release.py torch-version            print the trainer's torch pin (its [torch] extra)
    release.py check [--trainer-image]  every step of .github/workflows/release.yaml that does
                                        not push (`make release-check`)

The version has one home, operator/pyproject.toml. The copies below cannot import it (a chart,
another package, Dockerfile defaults) and are checked against it; the workflow runs
`check-version --tag "$GITHUB_REF_NAME"` before it builds anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(REPO / "hack"))
CHART = str(REPO / "charts" / "kube-ddp")
CHANGELOG = "CHANGELOG.md"
# `## 0.2.0 - 2026-12-01` or `## [0.2.0] - ...`: a section of CHANGELOG.md per version.
SECTION = re.compile(r"^## \[?v?(?P<version>[0-9][^\]\s]*)\]?", re.MULTILINE)
DOCKERFILE_VERSION = re.compile(r"^ARG VERSION=(?P<version>\S+)$", re.MULTILINE)


def version(root: Path = REPO) -> str:
    pyproject = tomllib.loads((root / "operator" / "pyproject.toml").read_text())
    return str(pyproject["project"]["version"])


def _pyproject(path: str) -> Callable[[Path], str | None]:
    def read(root: Path) -> str | None:
        return str(tomllib.loads((root / path).read_text())["project"]["version"])

    return read


def _chart(key: str) -> Callable[[Path], str | None]:
    def read(root: Path) -> str | None:
        value = yaml.safe_load((root / "charts/kube-ddp/Chart.yaml").read_text()).get(key)
        return None if value is None else str(value)

    return read


def _dockerfile(path: str) -> Callable[[Path], str | None]:
    def read(root: Path) -> str | None:
        found = DOCKERFILE_VERSION.search((root / path).read_text())
        return found.group("version") if found else None

    return read


# Where the version is copied, and how to fix each copy.
COPIES: dict[str, tuple[Callable[[Path], str | None], str]] = {
    "charts/kube-ddp/Chart.yaml version": (_chart("version"), "run `make manifests`"),
    "charts/kube-ddp/Chart.yaml appVersion": (_chart("appVersion"), "run `make manifests`"),
    "trainer_image/pyproject.toml": (_pyproject("trainer_image/pyproject.toml"), "edit it"),
    "Dockerfile ARG VERSION": (_dockerfile("Dockerfile"), "edit its default"),
    "trainer_image/Dockerfile ARG VERSION": (
        _dockerfile("trainer_image/Dockerfile"),
        "edit its default",
    ),
}


def torch_version(root: Path = REPO) -> str:
    """The torch of the trainer's [torch] extra: the CPU trainer image's base is built with it."""
    extra = tomllib.loads((root / "trainer_image" / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["torch"]
    pins = [r.split("==", 1)[1] for r in extra if r.replace(" ", "").startswith("torch==")]
    if len(pins) != 1:
        raise SystemExit(f"trainer_image/pyproject.toml: no torch==X.Y.Z in [torch]: {extra}")
    return str(pins[0])


def release_notes(text: str, wanted: str) -> str | None:
    """The body of CHANGELOG.md's section for `wanted`, or None without one."""
    sections = list(SECTION.finditer(text))
    for i, section in enumerate(sections):
        if section.group("version") == wanted:
            end = sections[i + 1].start() if i + 1 < len(sections) else len(text)
            return text[section.end() : end].split("\n", 1)[-1].strip() + "\n"
    return None


def version_problems(root: Path = REPO, tag: str | None = None) -> list[str]:
    """What disagrees with operator/pyproject.toml's version: each copy, the tag, CHANGELOG."""
    wanted = version(root)
    problems = []
    for where, (read, fix) in COPIES.items():
        found = read(root)
        if found != wanted:
            problems.append(f"{where} says {found}, operator/pyproject.toml {wanted}: {fix}")
    if tag is not None and tag != f"v{wanted}":
        problems.append(
            f"tag {tag} is not v{wanted} (operator/pyproject.toml): tag v{wanted}, or set the "
            "version in operator/pyproject.toml and run `make manifests`"
        )
    if release_notes((root / CHANGELOG).read_text(), wanted) is None:
        problems.append(f"{CHANGELOG} has no `## {wanted}` section: the release notes")
    return problems


# --- make release-check ---


def step(what: str, *command: str, env: dict[str, str] | None = None) -> str:
    start = time.monotonic()
    print(f"release-check: {what}", file=sys.stderr, flush=True)
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise SystemExit(f"release-check: {what} failed:\n{result.stdout}{result.stderr}")
    print(f"release-check: {what}: {time.monotonic() - start:.1f} s", file=sys.stderr)
    return result.stdout


def archive_digest(archive: Path) -> str:
    """The manifest digest of a one-image OCI archive: what a registry would serve it as."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise SystemExit(f"{archive}: no index.json")
        (manifest,) = json.load(member)["manifests"]
    return str(manifest["digest"])


def check_chart(operator_digest: str) -> None:
    """helm lint, helm package at the version, the packaged chart rendered digest-pinned."""
    helm = [sys.executable, str(REPO / "hack/dev-cluster.py"), "tool", "helm"]
    with tempfile.TemporaryDirectory(prefix="kube-ddp-release-") as scratch:
        env = {  # helm's cache, config and data: nothing written in ~
            **os.environ,
            **{
                f"HELM_{kind}_HOME": f"{scratch}/{kind.lower()}"
                for kind in ("CACHE", "CONFIG", "DATA")
            },
        }
        step("chart files current", sys.executable, str(REPO / "hack/chart.py"), "check")
        step("helm lint --strict", *helm, "lint", "--strict", CHART, env=env)
        step("helm package", *helm, "package", CHART, "--destination", scratch, env=env)
        archive = Path(scratch) / f"kube-ddp-{version()}.tgz"
        if not archive.is_file():
            raise SystemExit(f"release-check: helm package did not write {archive.name}")
        rendered = step(
            "the packaged chart, the operator image pinned by digest",
            *helm, "template", "kube-ddp", str(archive), f"--set=image.digest={operator_digest}",
            env=env,
        )  # fmt: skip
    images = re.findall(r"^\s*image: (\S+)$", rendered, re.MULTILINE)
    pinned = f"ghcr.io/kube-ddp/kube-ddp-operator@{operator_digest}"
    if images != [pinned]:
        raise SystemExit(f"release-check: the chart's images are {images}, not [{pinned}]")


def check(trainer_image: bool) -> int:
    problems = version_problems()
    for problem in problems:
        print(f"version: {problem}", file=sys.stderr)
    if problems:
        return 1
    from devcluster import images, packages

    packages.ensure([packages.IMAGE_BUILDS])
    start = time.monotonic()
    print("release-check: operator image (amd64, buildah)", file=sys.stderr, flush=True)
    archive = images.operator_image_archive()
    digest = archive_digest(archive)
    print(f"release-check: {archive} {digest}: {time.monotonic() - start:.0f} s", file=sys.stderr)
    check_chart(digest)
    if trainer_image:
        start = time.monotonic()
        print("release-check: CPU trainer image (amd64, buildah)", file=sys.stderr, flush=True)
        built = images.trainer_cpu_image(torch_version())
        print(f"release-check: {built}: {time.monotonic() - start:.0f} s", file=sys.stderr)
    print("release-check: every step that does not push passed", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="print the version")
    check_version = commands.add_parser("check-version", help="the copies and the tag agree")
    check_version.add_argument("--tag", help="the git tag being released, e.g. v0.2.0")
    commands.add_parser("notes", help="the release notes: CHANGELOG.md's section")
    commands.add_parser("torch-version", help="the trainer's torch pin")
    check_all = commands.add_parser("check", help="every release step that does not push")
    check_all.add_argument(
        "--trainer-image",
        action="store_true",
        help="also build the CPU trainer image (its torch base is about 6 GB: minutes)",
    )
    args = parser.parse_args()
    if args.command == "version":
        print(version())
    elif args.command == "torch-version":
        print(torch_version())
    elif args.command == "check-version":
        problems = version_problems(tag=args.tag)
        for problem in problems:
            print(f"version: {problem}", file=sys.stderr)
        return 1 if problems else 0
    elif args.command == "check":
        return check(args.trainer_image)
    else:
        notes = release_notes((REPO / CHANGELOG).read_text(), version())
        if notes is None:
            print(f"{CHANGELOG} has no `## {version()}` section", file=sys.stderr)
            return 1
        print(notes, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
