"""kube_ddp: a Kubernetes operator for PyTorch DistributedDataParallel training jobs."""

from importlib.metadata import version

# One home: operator/pyproject.toml (hack/release.py checks the copies that cannot read it).
__version__ = version("kube-ddp")
