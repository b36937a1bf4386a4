"""kube_ddp: a Kubernetes operator for PyTorch DistributedDataParallel training jobs."""

from importlib.metadata import PackageNotFoundError, version

# One home: operator/pyproject.toml (hack/release.py checks the copies that cannot read it). A
# source tree put on PYTHONPATH without installing it (a GPU machine's own Python) has no
# metadata: it says so rather than failing every import.
try:
    __version__ = version("kube-ddp")
except PackageNotFoundError:
    __version__ = "0+source"
