"""Where things are: the repository, the binary cache, the running cluster's state, and the log
and error types every module uses."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
# The state of a running cluster (git-ignored); `up` starts from an empty one. One cluster per
# state directory: KUBEDDP_STATE_DIR gives a clone a second (`make test`'s lane beside).
STATE_DIR = Path(os.environ.get("KUBEDDP_STATE_DIR") or REPO / ".cluster")
PKI = STATE_DIR / "pki"
RUN = STATE_DIR / "run"
LOGS = STATE_DIR / "logs"
STATE_FILE = STATE_DIR / "state.json"
KUBECONFIG = STATE_DIR / "kubeconfig"
# Built binaries and Go's caches, shared by every clone on the machine.
CACHE_DIR = Path(os.environ.get("KUBEDDP_CACHE_DIR") or Path.home() / ".cache" / "kube-ddp")
# Locks for what there is one of per machine (the real node, a fixed port): in the default
# cache, whichever cache KUBEDDP_CACHE_DIR gives a clone.
MACHINE_LOCKS = Path.home() / ".cache" / "kube-ddp"


class BuildError(RuntimeError):
    pass


class ClusterError(RuntimeError):
    pass


@contextlib.contextmanager
def machine_lock(name: str, timeout: float | None = None, why: str = "") -> Iterator[Path]:
    """Hold the machine-wide lock `name` (waiting `timeout` seconds at most; None: for ever).
    Opened read-only, so a lock file another user made still locks."""
    MACHINE_LOCKS.mkdir(parents=True, exist_ok=True)
    path = MACHINE_LOCKS / f"{name}.lock"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    raise ClusterError(f"{path} was held for {timeout:.0f} s: {why}") from None
                time.sleep(0.5)
        yield path
    finally:
        os.close(fd)


_THIS_THREAD = threading.local()


def log_to(stream: TextIO) -> None:
    """This thread's log lines to `stream` from now on, not sys.stderr: a test session's
    background builds write past the output capture of the test that runs meanwhile."""
    _THIS_THREAD.stream = stream


def log(message: str) -> None:
    stream = getattr(_THIS_THREAD, "stream", None) or sys.stderr
    print(f"dev-cluster: {message}", file=stream, flush=True)
