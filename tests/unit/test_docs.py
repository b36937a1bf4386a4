"""The repository's own references hold: every path a file names exists in a clone, and the
design document lists the reasons the code writes and the modules it is made of."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_trainer import contract
from kube_ddp.api import load_job
from kube_ddp.crd import PRINTER_COLUMNS
from kube_ddp.reasons import PodReason, Reason
from tests.kind.lines import as_run_here, build_arg, dockerfile, kind_lines
from tests.unit.support import EXAMPLES, REPO, validate_strict

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


# design.md's module tables, by heading, and the package each describes.
MODULE_TABLES = {
    "### Operator modules": REPO / "operator" / "kube_ddp",
    "### Trainer modules": REPO / "trainer_image" / "ddp_trainer",
}


def module_rows(heading: str) -> list[tuple[str, str]]:
    """(module cell, description cell) of each row of the table under `heading`."""
    design = (REPO / "docs" / "design.md").read_text()
    section = design.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line[1:].split(" | ", 1) for line in section.splitlines() if line.startswith("| `")]
    return [(cell, description) for cell, description in rows]


@pytest.mark.parametrize("heading", MODULE_TABLES)
def test_the_design_s_module_tables_list_every_module_and_no_other(heading: str) -> None:
    """A row names modules (`api.py`) or a package (`status/`), whose modules its description
    names (`views`): every module of the package is in a row, and every row's name exists."""
    package = MODULE_TABLES[heading]
    modules = {
        str(path.relative_to(package))
        for path in [*package.glob("*.py"), *package.glob("*/*.py")]
        if path.name != "__init__.py"
    }
    named: set[str] = set()
    described: set[str] = set()
    for cell, description in module_rows(heading):
        for name in re.findall(r"`([\w/.]+)`", cell):
            named.add(name)
            if name.endswith("/"):
                described |= {f"{name}{word}.py" for word in re.findall(r"`(\w+)`", description)}
    missing = sorted(modules - named - described)
    assert not missing, f"design.md's {heading} has no row for {missing}"
    gone = sorted(name for name in named if not (package / name).exists())
    assert not gone, f"design.md's {heading} has rows for no module: {gone}"


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
    for name, value in contract.NCCL_WATCHDOG_ENV.items():
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
            for document in yaml.safe_load_all(block):
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


STORAGE = REPO / "docs" / "storage.md"


def storage_objects() -> dict[str, dict[str, Any]]:
    """docs/storage.md's objects by name: the examples' claims and the loading Job."""
    found = {}
    for block in FENCED_YAML.findall(STORAGE.read_text()):
        for document in yaml.safe_load_all(block):
            found[document["metadata"]["name"]] = document
    return found


def example_claims() -> list[tuple[str, str, bool]]:
    """(example, claim, mounted read-only) for every claim an example job mounts."""
    claims = []
    for path in EXAMPLES:
        for document in yaml.safe_load_all(path.read_text()):
            if not document or document.get("kind") != "DDPTrainingJob":
                continue
            template = document["spec"].get("template", {})
            for volume in template.get("volumes", []):
                claim = volume.get("persistentVolumeClaim")
                if claim:
                    mounts = [m for m in template["volumeMounts"] if m["name"] == volume["name"]]
                    read_only = all(m.get("readOnly") for m in mounts) or claim.get("readOnly")
                    claims.append((path.name, claim["claimName"], bool(read_only)))
    return claims


def test_every_claim_an_example_mounts_is_in_storage_md_with_a_mode_that_fits() -> None:
    """Workers on different nodes share each claim: read-only ones need ReadOnlyMany or
    ReadWriteMany, written ones ReadWriteMany."""
    objects = storage_objects()
    for obj in objects.values():
        validate_strict(obj)
    for example, claim, read_only in example_claims():
        assert claim in objects, f"{example} mounts {claim}, which docs/storage.md lacks"
        modes = set(objects[claim]["spec"]["accessModes"])
        fits = {"ReadOnlyMany", "ReadWriteMany"} if read_only else {"ReadWriteMany"}
        assert modes & fits, f"{claim} ({example}) is {modes}"


def test_the_loading_job_writes_cifar10_where_the_examples_read_it(tmp_path: Path) -> None:
    """The Job's own code, its imports run as written and its download replaced by the layout
    it writes; then each example that mounts the claim finds the batches at its dataDir."""
    from ddp_trainer import datasets

    (container,) = storage_objects()["load-cifar10"]["spec"]["template"]["spec"]["containers"]
    (claim_mount,) = container["volumeMounts"]
    code = container["command"][-1].replace(claim_mount["mountPath"], str(tmp_path))
    imports = [line for line in code.splitlines() if line.startswith(("from ", "import "))]
    names: dict[str, Any] = {}
    exec("\n".join(imports), names)  # the names the Job uses exist in the trainer

    def lay_out(options: Any) -> None:  # where download_dataset unpacks the batches
        batches = Path(options.data_dir) / options.dataset / datasets.CIFAR_DIR
        batches.mkdir(parents=True)
        (batches / datasets.CIFAR_TEST_BATCH).write_bytes(b"")

    calls = [line for line in code.splitlines() if line and line not in imports]
    exec("\n".join(calls), {**names, "download_dataset": lay_out})
    readers = {example for example, claim, _ in example_claims() if claim == "cifar10"}
    assert readers, "no example mounts the cifar10 claim"
    for path in EXAMPLES:
        if path.name not in readers:
            continue
        spec = yaml.safe_load(path.read_text())["spec"]
        (mount,) = [m for m in spec["template"]["volumeMounts"] if m["mountPath"] == "/data"]
        data_dir = spec["trainer"]["dataDir"].replace(mount["mountPath"], str(tmp_path), 1)
        assert datasets._find_cifar_dir(Path(data_dir)).is_dir(), path.name


def test_the_readme_s_kubectl_get_shows_the_crd_s_columns() -> None:
    """The sample `kubectl get ddpjobs` has the columns kubectl prints by default (priority 0),
    in their order."""
    readme = (REPO / "README.md").read_text()
    header = readme.split("$ kubectl get ddpjobs\n", 1)[1].splitlines()[0].split()
    shown = [c["name"].upper() for c in PRINTER_COLUMNS if not c.get("priority")]
    assert header == ["NAME", *shown]
