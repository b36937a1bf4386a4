"""The release's chart steps with the dev cluster's helm, offline (no cluster needed): helm as
Helm's release build (it knows a current Kubernetes without --kube-version), `helm package` at
the release's version, and image references pinned by digest.

The version check is tests/unit/test_release.py; `make release-check` (hack/release.py check)
runs these steps and the image builds.
"""

from __future__ import annotations

import pytest
import yaml

from tests.cluster.helm_support import CHART, Helm, helm_binary
from tests.cluster.support import load_dev_cluster


@pytest.fixture(scope="module")
def offline_helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    dev_cluster = load_dev_cluster()
    try:
        dev_cluster.built("helm")
    except dev_cluster.BuildError as error:
        pytest.skip(f"helm is not built: {error}")
    home = tmp_path_factory.mktemp("helm-home")
    return Helm(helm_binary(), home / "no-kubeconfig", home)


def test_helm_template_needs_no_kube_version(offline_helm: Helm) -> None:
    """The chart's kubeVersion (>=1.29) holds for the Kubernetes helm assumes offline."""
    rendered = offline_helm.run("template", "kube-ddp", str(CHART)).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(rendered) if d]
    assert "Deployment" in kinds
