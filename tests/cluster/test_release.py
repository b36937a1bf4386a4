"""The release's chart steps with the dev cluster's helm, offline (no cluster needed): helm as
Helm's release build (it knows a current Kubernetes without --kube-version), `helm package` at
the release's version, and image references pinned by digest.

The version check is tests/unit/test_release.py; `make release-check` (hack/release.py check)
runs these steps and the image builds.
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import yaml

import kube_ddp
from tests.cluster.helm_support import CHART, Helm


def test_helm_template_needs_no_kube_version(offline_helm: Helm) -> None:
    """The chart's kubeVersion (>=1.30) holds for the Kubernetes helm assumes offline."""
    rendered = offline_helm.run("template", "kube-ddp", str(CHART)).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(rendered) if d]
    assert "Deployment" in kinds


def test_helm_lint_strict_passes(offline_helm: Helm) -> None:
    offline_helm.run("lint", "--strict", str(CHART))


def test_helm_package_is_the_release_version(offline_helm: Helm, tmp_path: Path) -> None:
    offline_helm.run("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("*.tgz")
    assert archive.name == f"kube-ddp-{kube_ddp.__version__}.tgz"
    with tarfile.open(archive) as tar:
        member = tar.extractfile("kube-ddp/Chart.yaml")
        assert member is not None
        packaged = yaml.safe_load(member)
        assert "kube-ddp/crds/ddptrainingjobs.kubeddp.io.yaml" in tar.getnames()
    assert packaged["version"] == packaged["appVersion"] == kube_ddp.__version__


def test_image_digest_pins_the_operator_image(offline_helm: Helm) -> None:
    digest = "sha256:" + hashlib.sha256(b"kube-ddp").hexdigest()
    rendered = offline_helm.run(
        "template", "kube-ddp", str(CHART), f"--set=image.digest={digest}", "--set=image.tag=x"
    ).stdout
    (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/kube-ddp/kube-ddp-operator@{digest}"


def test_a_malformed_digest_is_refused(offline_helm: Helm) -> None:
    result = offline_helm.run(
        "template", "kube-ddp", str(CHART), "--set=image.digest=sha256:abc", check=False
    )
    assert result.returncode != 0
    assert "/image/digest" in result.stderr and "does not match pattern" in result.stderr
