"""A component of the dev cluster that loses a known race as it starts (kwok v0.8.0's
"fatal error: concurrent map writes") is started again, saying why; any other death is not."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster.support import load_dev_cluster

dev_cluster = load_dev_cluster()
RACE = dev_cluster.controlplane.KWOK_START_RACE


Start = Callable[[], subprocess.Popen[bytes]]
Up = Callable[[subprocess.Popen[bytes]], None]


def component(
    tmp_path: Path, lost_starts: int, said: str = f"fatal error: {RACE}"
) -> tuple[Start, Up, Path]:
    """Starts of a fake component: the first `lost_starts` print `said` and exit 2 at once,
    later ones stay up; `up` holds for one that is still running after 0.3 s."""
    count = tmp_path / "starts"
    count.write_text("0")
    script = (
        f'n=$(cat {count}); echo $((n + 1)) > {count}; if [ "$n" -lt {lost_starts} ]; then '
        f'echo "{said}"; echo "goroutine 1 [running]:"; exit 2; fi; exec sleep 30'
    )

    def start() -> subprocess.Popen[bytes]:
        return dev_cluster.processes.spawn_to(tmp_path / "fake.log", ["sh", "-c", script])

    def up(process: subprocess.Popen[bytes]) -> None:
        since = time.monotonic()
        steady = lambda: time.monotonic() - since > 0.3  # noqa: E731
        dev_cluster.processes.wait_until("fake", steady, 5, {"fake": process}, logs=tmp_path)

    return start, up, count


def test_a_start_lost_to_the_known_race_is_started_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start, up, count = component(tmp_path, lost_starts=2)
    process = dev_cluster.processes.start_until_up("fake", start, up, RACE, 4, logs=tmp_path)
    try:
        assert process.poll() is None
        assert count.read_text().strip() == "3"
        assert capsys.readouterr().err.count(f"fake exited at start with '{RACE}'") == 2
    finally:
        process.kill()
        process.wait()


def test_another_death_or_too_many_lost_starts_is_the_error_it_was(tmp_path: Path) -> None:
    start, up, count = component(tmp_path, lost_starts=1, said="open config: no such file")
    with pytest.raises(dev_cluster.ClusterError, match="no such file"):
        dev_cluster.processes.start_until_up("fake", start, up, RACE, 4, logs=tmp_path)
    assert count.read_text().strip() == "1"
    start, up, count = component(tmp_path, lost_starts=9)
    with pytest.raises(dev_cluster.ClusterError, match="exited with 2"):
        dev_cluster.processes.start_until_up("fake", start, up, RACE, 3, logs=tmp_path)
    assert count.read_text().strip() == "3"


def test_no_port_is_handed_out_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Ports picked for components that bind them later are all different: 600 picks from
    1,000 ports, where independent picks would repeat one (Kueue's health and metrics servers
    were once given the same port)."""
    controlplane = dev_cluster.controlplane
    low = controlplane.LOWEST_PICKED_PORT
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text(f"{low + 1000}\t60999\n")
    monkeypatch.setattr(controlplane, "EPHEMERAL_RANGE", ephemeral)
    monkeypatch.setattr(controlplane, "_handed", set())
    ports = [controlplane.free_port() for _ in range(600)]
    assert len(set(ports)) == 600
    assert all(low <= port < low + 1000 for port in ports)
