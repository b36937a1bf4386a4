"""The build cache's locks (hack/devcluster/build.py): `make test`'s two lanes build at
once, a component at most once, and neither waits for a build of another component."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.cluster.support import load_dev_cluster

build = load_dev_cluster().build


def test_one_components_builds_wait_for_each_other_not_for_another_components(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "CACHE_DIR", tmp_path)
    held, release = threading.Event(), threading.Event()

    def hold_kubernetes() -> None:
        with build.cache_lock("kubernetes"):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_kubernetes)
    holder.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        with build.cache_lock("versitygw"):
            assert time.monotonic() - started < 1  # another component's: at once
        waited: list[float] = []

        def take_kubernetes() -> None:
            began = time.monotonic()
            with build.cache_lock("kubernetes"):
                waited.append(time.monotonic() - began)

        taker = threading.Thread(target=take_kubernetes)
        taker.start()
        time.sleep(0.5)
        assert waited == []  # the same component's: after the holder
        release.set()
        taker.join(10)
        assert len(waited) == 1 and waited[0] >= 0.5
    finally:
        release.set()
        holder.join(10)
