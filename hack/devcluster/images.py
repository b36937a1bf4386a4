"""Container images for the real node, made here: nothing can be pulled on our machines.

- `localhost/pause:local`: the pod sandbox, a static build of pause.c (next to this file).
- `localhost/hostusr:local`: an almost empty root file system whose /bin, /lib, /lib64 and
  /sbin point into /usr, plus /etc/passwd and /etc/group. A pod that mounts the host's /usr
  (and the Python installation and the repository, read-only) runs the project's own .venv:
  the trainer's torch is several GB, far too heavy to build into an image on every machine.
  It stands in for the trainer image (trainer_image/Dockerfile) in what a pod can tell: the
  user `trainer` (uid and gid 10001, a login shell, home /home/trainer) it runs as, its
  working directory and environment, and a /tmp every user can write.

Each is written as an OCI image archive (one uncompressed layer) and imported into the node's
containerd with `ctr images import`.

- `localhost/kube-ddp-operator:dev`: the operator image, built from the repository's own
  Dockerfile with Debian's buildah on a local Debian trixie Python base (the python:*-slim
  base cannot be pulled); the e2e tier runs the operator from it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from ddp_trainer import contract
from devcluster.paths import CACHE_DIR, REPO, ClusterError
from devcluster.processes import run

PAUSE_IMAGE = "localhost/pause:local"
HOST_USR_IMAGE = "localhost/hostusr:local"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HERE = Path(__file__).resolve().parent

AddFiles = Callable[[tarfile.TarFile], None]


def _entry(
    tar: tarfile.TarFile,
    name: str,
    *,
    data: bytes = b"",
    mode: int | None = None,
    link: str | None = None,
    directory: bool = False,
    owner: tuple[int, int] = (0, 0),
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid, info.gid = owner
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755 if mode is None else mode
        tar.addfile(info)
    elif link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644 if mode is None else mode
        tar.addfile(info, io.BytesIO(data))


def _layer(add_files: AddFiles) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_files(tar)
    return buffer.getvalue()


def write_oci_archive(
    name: str,
    add_files: AddFiles,
    command: list[str],
    out: Path,
    runtime: dict[str, object] | None = None,
) -> None:
    """An OCI image layout archive of one layer, named `name` for `ctr images import`;
    `runtime` adds to its config (User, WorkingDir, Env)."""
    layer = _layer(add_files)
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_descriptor = blob(layer, "application/vnd.oci.image.layer.v1.tar")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": command, "Env": [f"PATH={PATH}"], **(runtime or {})},
        "rootfs": {"type": "layers", "diff_ids": [layer_descriptor["digest"]]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [layer_descriptor],
    }
    manifest_descriptor = blob(
        json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json"
    )
    manifest_descriptor["annotations"] = {"io.containerd.image.name": name}
    index = {"schemaVersion": 2, "manifests": [manifest_descriptor]}
    with tarfile.open(out, "w") as archive:
        _entry(archive, "oci-layout", data=b'{"imageLayoutVersion": "1.0.0"}')
        _entry(archive, "index.json", data=json.dumps(index).encode())
        for digest, data in blobs.items():
            _entry(archive, f"blobs/sha256/{digest.removeprefix('sha256:')}", data=data)


def _pause_files(binary: Path) -> AddFiles:
    def add(tar: tarfile.TarFile) -> None:
        _entry(tar, "pause", data=binary.read_bytes(), mode=0o755)

    return add


# What the trainer image's Dockerfile gives its user and its processes (trainer_image/Dockerfile:
# useradd --uid 10001 --user-group --create-home --shell /bin/bash trainer, USER, WORKDIR, ENV).
TRAINER_UID = contract.IMAGE_UID
TRAINER_GID = contract.IMAGE_GID
TRAINER_HOME = "/home/trainer"
TRAINER_RUNTIME: dict[str, object] = {
    "User": f"{TRAINER_UID}:{TRAINER_GID}",
    "WorkingDir": TRAINER_HOME,
    "Env": [f"PATH={PATH}", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
}


def _host_usr_files(tar: tarfile.TarFile) -> None:
    for directory in ("usr", "etc", "root", "proc", "sys", "dev", "run", "var", "home"):
        _entry(tar, directory, directory=True)
    _entry(tar, "tmp", directory=True, mode=0o1777)
    _entry(tar, TRAINER_HOME.lstrip("/"), directory=True, owner=(TRAINER_UID, TRAINER_GID))
    for name in ("bin", "lib", "lib64", "sbin"):  # Debian 12 is merged-usr
        _entry(tar, name, link=f"usr/{name}")
    _entry(
        tar,
        "etc/passwd",
        data=b"root:x:0:0:root:/root:/bin/sh\n"
        + f"trainer:x:{TRAINER_UID}:{TRAINER_GID}::{TRAINER_HOME}:/bin/bash\n".encode()
        # the privilege separation user of the host's sshd, for pods that run it as root
        + b"sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n",
    )
    _entry(
        tar,
        "etc/group",
        data=f"root:x:0:\ntrainer:x:{TRAINER_GID}:\nnogroup:x:65534:\n".encode(),
    )


def build_pause(work: Path) -> Path:
    if shutil.which("gcc") is None:
        raise ClusterError("gcc is needed to build the pod sandbox (pause) image")
    binary = work / "pause"
    run("gcc", "-static", "-Os", "-o", str(binary), str(HERE / "pause.c"), what="building pause")
    return binary


def import_images(ctr: list[str]) -> None:
    """Build both images and import them with `ctr` (its argv prefix)."""
    with tempfile.TemporaryDirectory(prefix="kube-ddp-images-") as scratch:
        work = Path(scratch)
        archives = {
            PAUSE_IMAGE: (_pause_files(build_pause(work)), ["/pause"], None),
            HOST_USR_IMAGE: (_host_usr_files, ["/bin/sh"], TRAINER_RUNTIME),
        }
        for name, (add_files, command, runtime) in archives.items():
            out = work / (name.split("/")[-1].replace(":", "-") + ".tar")
            write_oci_archive(name, add_files, command, out, runtime)
            run(*ctr, "images", "import", str(out), what=f"importing {name}")


# --- the operator's own image, from its Dockerfile ---------------------------------------------

OPERATOR_IMAGE = "localhost/kube-ddp-operator:dev"
PYTHON_BASE = (
    "localhost/debian-python:trixie"  # stands in for python:*-slim, which cannot be pulled
)
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What the operator Dockerfile copies: a change to any of them means a new image.
OPERATOR_SOURCES = (
    "Dockerfile",
    "operator",
    "trainer_image/pyproject.toml",
    "trainer_image/ddp_trainer",
    "trainer_image/horovod",
)


def _buildah() -> list[str]:
    store = CACHE_DIR / "containers"
    return [
        "buildah",
        "--root", str(store / "root"),
        "--runroot", str(store / "run"),
        "--storage-driver", "overlay",
    ]  # fmt: skip


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for top in OPERATOR_SOURCES:
        paths = [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*"))
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _python_base(name: str = PYTHON_BASE, python: str = "python3-venv") -> None:
    """Debian trixie's Python as the local base image `name` (made once, kept in the store)."""
    if _image_exists(name):
        return
    with tempfile.TemporaryDirectory(prefix="kube-ddp-base-") as scratch:
        rootfs = Path(scratch) / "trixie.tar"
        run(
            "mmdebstrap", "--variant=minbase",
            f"--include=ca-certificates,python3,{python}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "trixie", str(rootfs),
            what="mmdebstrap (the operator image's Python base)",
        )  # fmt: skip
        container = run(*_buildah(), "from", "scratch").strip()
        try:
            run(*_buildah(), "add", container, str(rootfs), "/")
            run(*_buildah(), "config", "--env", f"PATH={PATH}", "--cmd", "python3", container)
            run(*_buildah(), "commit", "--quiet", container, name)
        finally:
            run(*_buildah(), "rm", container, check=False)


def python_bases() -> dict[str, str]:
    """The local stand-ins for the Dockerfiles' `PYTHON_IMAGE` (made once): the operator's
    base, and the torch CPU base's, which runs pip."""
    _python_base()
    _python_base(PIP_BASE, "python3-pip")
    return {"Dockerfile": PYTHON_BASE, "trainer_image/torch-cpu.Dockerfile": PIP_BASE}


def _bud(what: str, *args: str) -> None:
    """`buildah bud` in the repository: host network, the host's CA bundle mounted for pip."""
    run(
        *_buildah(), "bud", "--quiet", "--runtime", "/usr/sbin/runc", "--network", "host",
        "--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", *args, ".",
        what=f"building {what} (buildah bud)",
        cwd=REPO,
    )  # fmt: skip


def operator_image_archive() -> Path:
    """The operator image built from the repository's own Dockerfile with buildah (no daemon,
    host network, the host's CA bundle mounted for pip, not copied), as an OCI archive cached
    by the digest of what the Dockerfile copies."""
    archive = CACHE_DIR / "images" / f"kube-ddp-operator-{_sources_digest()}.tar"
    if archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    _python_base()
    _bud(
        "the operator image", "--build-arg", f"PYTHON_IMAGE={PYTHON_BASE}", "--tag", OPERATOR_IMAGE
    )
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    run(*_buildah(), "push", "--quiet", OPERATOR_IMAGE, f"oci-archive:{partial}:{OPERATOR_IMAGE}")
    partial.rename(archive)
    for old in archive.parent.glob("kube-ddp-operator-*.tar"):
        if old != archive:
            old.unlink()
    return archive


# --- the release's CPU trainer image (hack/release.py check --trainer-image) ---------------------

TRAINER_CPU_IMAGE = "localhost/ddp-trainer:dev-cpu"
# The trainer's Dockerfiles run `python3 -m pip`, as python:*-slim has it; Debian's is a package.
PIP_BASE = "localhost/debian-python-pip:trixie"
# PyTorch's CPU wheel index cannot be reached here: PyPI's torch, whose x86_64 wheel brings the
# CUDA libraries (about 3 GB) and runs on CPU all the same.
TORCH_INDEX = "https://pypi.org/simple"


def _image_exists(name: str) -> bool:
    listed = subprocess.run(
        [*_buildah(), "images", "--quiet", name], capture_output=True, check=False
    )
    return listed.returncode == 0 and bool(listed.stdout.strip())


def trainer_cpu_image(torch_version: str) -> str:
    """The `-cpu` trainer image as the release builds it: trainer_image/torch-cpu.Dockerfile
    (kept in the store once built: about 6 GB and minutes), then trainer_image/Dockerfile on it.
    The image's name in the buildah store."""
    _python_base(PIP_BASE, "python3-pip")
    # Tagged by what builds it too: a changed Dockerfile (torchvision's pin) builds anew.
    recipe = (REPO / "trainer_image" / "torch-cpu.Dockerfile").read_bytes()
    base = f"localhost/torch-cpu:{torch_version}-{hashlib.sha256(recipe).hexdigest()[:12]}"
    if not _image_exists(base):
        _bud(
            "the torch CPU base",
            "--file", "trainer_image/torch-cpu.Dockerfile",
            "--build-arg", f"PYTHON_IMAGE={PIP_BASE}",
            "--build-arg", f"TORCH_VERSION={torch_version}",
            "--build-arg", f"TORCH_INDEX={TORCH_INDEX}",
            "--tag", base,
        )  # fmt: skip
    _bud(
        "the CPU trainer image",
        "--file", "trainer_image/Dockerfile",
        "--build-arg", f"BASE_IMAGE={base}",
        "--tag", TRAINER_CPU_IMAGE,
    )  # fmt: skip
    return TRAINER_CPU_IMAGE


def import_operator_image(ctr: list[str]) -> None:
    run(
        *ctr, "images", "import", str(operator_image_archive()), what="importing the operator image"
    )
