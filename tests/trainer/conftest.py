"""The trainer tier: real torch.distributed processes (gloo, CPU) on tiny generated data."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.trainer import support
from tests.trainer.support import FakeApiServer

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.trainer)


@pytest.fixture(scope="session")
def idx_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MNIST-format dataset directory (gzipped IDX files)."""
    return support.write_idx_dataset(tmp_path_factory.mktemp("mnist"))


@pytest.fixture(scope="session")
def cifar_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding cifar-10-batches-py/ in the python pickle format."""
    return support.write_cifar_dataset(tmp_path_factory.mktemp("cifar"))


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    return path
