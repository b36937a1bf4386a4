"""Every example in manifests/examples/ that the real node (CPU only, 2 cores) can run, run as a
user applies it, as the image's non-root user. Where one cannot run here as shipped, the test
says what it changes and why:

- digits-cpu.yaml: the README's quick start (test_quickstart.py), unchanged.
- own-script/: test_jobs.py's own-script test, unchanged.
- mnist-mlp-cpu.yaml: here. Its four pods request 2 CPUs each (the node has 2 in all): the
  request is shrunk to 250m (the limit stays). MNIST's mirrors cannot be reached from this
  machine, so the files are made locally (scikit-learn's digits, scaled to 28x28, as IDX files
  in the layout `download` writes) and mounted at /data, and `download` is off (the download
  would find them with other checksums than MNIST's and fetch them again).
- The GPU and Gaudi examples need devices the node lacks: tests/cluster/test_pod_security.py
  sends each of their pods to the API server (a dry run in namespaces that enforce each Pod
  Security Standard level) and test_render_agreement.py their specs.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.cluster.operator_support import Jobs
from tests.cluster.support import REPO
from tests.e2e.platform import DevPlatform, Platform
from tests.e2e.test_jobs import TRAINING_TIMEOUT, logs

EXAMPLES = REPO / "manifests" / "examples"
RUN_ELSEWHERE = {"digits-cpu.yaml": "test_quickstart.py", "own-script/job.yaml": "test_jobs.py"}
RUN_HERE = {"mnist-mlp-cpu.yaml"}


def test_every_example_without_an_accelerator_is_run_by_this_tier() -> None:
    jobs = {
        str(p.relative_to(EXAMPLES)): yaml.safe_load(p.read_text())
        for p in EXAMPLES.rglob("*.yaml")
        if "kind: DDPTrainingJob" in p.read_text()
    }
    cpu = {name for name, job in jobs.items() if "accelerator" not in job["spec"]}
    assert cpu == set(RUN_ELSEWHERE) | RUN_HERE


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file, gzipped: magic 0 0 8 <ndim>, the sizes big-endian, the bytes."""
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def make_mnist_layout(directory: Path) -> None:
    """scikit-learn's digits (8x8, 0-16) as 28x28 bytes, in MNIST's four IDX files."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3))) * (255 / 16)  # 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    split = 1500
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte.gz", images[:split])
    write_idx(directory / "train-labels-idx1-ubyte.gz", digits.target[:split])
    write_idx(directory / "t10k-images-idx3-ubyte.gz", images[split:])
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", digits.target[split:])
    for path in [directory, *directory.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_the_mnist_mlp_example_trains_on_four_pods(platform: Platform, jobs: Jobs) -> None:
    if not isinstance(platform, DevPlatform):
        pytest.skip("the data set is made on the node's own file system (the dev cluster's)")
    document = yaml.safe_load((EXAMPLES / "mnist-mlp-cpu.yaml").read_text())
    spec: dict[str, Any] = document["spec"]
    name = document["metadata"]["name"]
    spec["resources"]["requests"]["cpu"] = "250m"
    spec["trainer"]["download"] = False
    data = platform.scratch_volume("data", jobs.namespace)
    make_mnist_layout(Path(data["hostPath"]["path"]) / spec["trainer"]["dataset"])
    spec["template"] = {
        "volumes": [data],
        "volumeMounts": [{"name": "data", "mountPath": spec["trainer"]["dataDir"]}],
    }
    jobs.create({**document, "spec": platform.job_spec(spec)})
    status = jobs.wait_phase(name, "Succeeded", timeout=TRAINING_TIMEOUT)
    assert status["restarts"] == 0, status.get("failure")
    assert status["training"]["valAccuracy"] > 0.3  # chance is 0.1; 5 epochs of few steps
    said = logs(jobs, f"{name}-worker-0")
    assert "world_size=4" in said, said[-3000:]
