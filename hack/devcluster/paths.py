"""Where things are: the repository, the binary cache, the running cluster's state, and the log
and error types every module uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
# The state of a running cluster (git-ignored); `up` starts from an empty one.
STATE_DIR = REPO / ".cluster"
PKI = STATE_DIR / "pki"
RUN = STATE_DIR / "run"
LOGS = STATE_DIR / "logs"
STATE_FILE = STATE_DIR / "state.json"
KUBECONFIG = STATE_DIR / "kubeconfig"
# Built binaries and Go's caches, shared by every clone on the machine.
CACHE_DIR = Path(os.environ.get("KUBEDDP_CACHE_DIR") or Path.home() / ".cache" / "kube-ddp")


class BuildError(RuntimeError):
    pass


class ClusterError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"dev-cluster: {message}", file=sys.stderr, flush=True)
