"""kube_ddp: a Kubernetes operator for PyTorch DistributedDataParallel training jobs."""

__version__ = "0.1.0"
