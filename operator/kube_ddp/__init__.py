"""kube_ddp: a Kubernetes operator for PyTorch DistributedDataParallel training jobs.

The Python client and the models a job is built from are importable from here
(`from kube_ddp import TrainerClient, DDPTrainingJobSpec, TrainerOptions, new_job`: see
kube_ddp.client), each loaded on first use: the operator's own imports of this package never
load the client's (docs/python-client.md).
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# One home: operator/pyproject.toml (hack/release.py checks the copies that cannot read it). A
# source tree put on PYTHONPATH without installing it (a GPU machine's own Python) has no
# metadata: it says so rather than failing every import.
try:
    __version__ = version("kube-ddp")
except PackageNotFoundError:
    __version__ = "0+source"

# The client's names, and the models a job is built from. Each is read from its module on first
# use, never imported at the top: import-linter would see this package import the client, and
# every core module that reads __version__ with it.
__all__ = [  # noqa: RUF022  (by module)
    "__version__",
    "ClientError",
    "JobEndedError",
    "JobExistsError",
    "JobFailedError",
    "JobNotFoundError",
    "LogsUnavailableError",
    "TrainerClient",
    "WaitTimeoutError",
    "new_job",
    "print_progress",
    "run_local",
    "Accelerator",
    "DDPTrainingJob",
    "DDPTrainingJobSpec",
    "EnvVar",
    "JobStatus",
    "Resources",
    "RunPolicy",
    "TrainingProgress",
    "TrainerOptions",
]


_HOMES = ("kube_ddp.api", "ddp_trainer.options", "kube_ddp.client")  # the cheapest first


def __getattr__(name: str) -> Any:
    if name in __all__:
        for home in _HOMES:
            module = import_module(home)
            if hasattr(module, name):
                value = getattr(module, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module 'kube_ddp' has no attribute {name!r}")
