"""A real S3-compatible object store for tests: versitygw, built from its Go module by the dev
cluster's tool builder (hack/devcluster/build.py, cached in ~/.cache/kube-ddp), serving a
temporary directory on a free port, stopped after.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.support import IN_CI, load_dev_cluster

START_TIMEOUT_S = 15.0
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://HOST:PORT
    access_key: str
    secret_key: str
    root: Path  # what versitygw serves: a directory per bucket, a file per object

    def env(self, **overrides: str) -> dict[str, str]:
        """The AWS variables a client of this server reads (boto3, the trainer)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            **overrides,
        }

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}),
        )

    def create_bucket(self) -> str:
        bucket = f"ckpt-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=bucket)
        return bucket


def versitygw_binary() -> Path:
    """The cached versitygw, built when the cache lacks it; skipped (failed in CI) without Go."""
    dev_cluster = load_dev_cluster()
    try:
        return Path(dev_cluster.built("versitygw"))
    except dev_cluster.BuildError as error:
        if shutil.which("go") is None and not IN_CI:
            pytest.skip(f"versitygw is not built: {error}")
        pytest.fail(f"versitygw did not build: {error}", pytrace=False)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_s3_server(root: Path, host: str = "127.0.0.1") -> Iterator[S3Server]:
    """versitygw serving `root` at host:<a free port> until the block ends."""
    binary = versitygw_binary()
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port(host)
    server = S3Server(f"http://{host}:{port}", "kubeddp", secrets.token_hex(16), root)
    log = (root.parent / f"versitygw-{port}.log").open("w")
    process = subprocess.Popen(
        [
            str(binary),
            "--access",
            server.access_key,
            "--secret",
            server.secret_key,
            "--port",
            f"{host}:{port}",
            "posix",
            str(root),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={"PATH": os.environ.get("PATH", "")},
    )
    try:
        _wait_until_listening(host, port, process)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_listening(host: str, port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"versitygw exited {process.returncode} before listening")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"versitygw did not listen on {host}:{port} in {START_TIMEOUT_S} s")
