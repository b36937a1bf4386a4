"""A rank's own time per step on a device that runs behind its host: `distributed.ComputeClock`
with events of a stand-in device (a CUDA event's record/query/elapsed_time), so the reading of
events a GPU-bound rank finishes steps late is proven on a CPU."""

from __future__ import annotations

import torch

from ddp_trainer.culprit import Entry, Ledger, slowest
from ddp_trainer.distributed import ComputeClock


class LaggingDevice:
    """Finishes the work of host step s at host step s + `lag`, each forward taking `ms`."""

    def __init__(self, lag: int, ms: float) -> None:
        self.lag, self.ms, self.step = lag, ms, 0

    def event(self) -> Event:
        return Event(self)


class Event:
    def __init__(self, device: LaggingDevice) -> None:
        self.device = device
        self.at = -1

    def record(self) -> None:
        self.at = self.device.step

    def query(self) -> bool:
        return self.device.step - self.at >= self.device.lag

    def elapsed_time(self, end: Event) -> float:
        assert self.query() and end.query(), "read before the device finished"
        return self.device.ms


def laps(device: LaggingDevice, steps: int) -> list[float | None]:
    clock = ComputeClock(torch.device("cpu"), event=device.event)
    said = []
    for _ in range(steps):
        clock.start()
        said.append(clock.lap())
        device.step += 1
    return said


def test_a_device_steps_behind_its_host_is_timed_once_it_catches_up() -> None:
    said = laps(LaggingDevice(lag=5, ms=40.0), steps=20)
    assert said[:5] == [None] * 5  # nothing finished yet: nothing waited for
    assert said[5:] == [0.04] * 15  # then every step, as the device finishes it


def test_a_device_further_behind_than_the_events_in_flight_is_still_timed() -> None:
    lag = ComputeClock.IN_FLIGHT * 3
    said = laps(LaggingDevice(lag=lag, ms=25.0), steps=lag * 2)
    timed = [value for value in said if value is not None]
    assert timed and set(timed) == {0.025}
    assert said.index(0.025) == lag  # the oldest pair was kept until it finished


def test_the_rank_whose_device_is_slowed_is_named_the_straggler() -> None:
    """Four GPU-bound ranks, their devices 4 steps behind; rank 2's takes 3x as long."""
    entries = []
    for rank, ms in enumerate([10.0, 11.0, 30.0, 10.5]):
        ledger = Ledger(
            store=None, sequence=lambda: None, rank=rank, interval=30, pod="p", node="n"
        )
        for lap in laps(LaggingDevice(lag=4, ms=ms), steps=12):
            ledger.timed(lap)
        entries.append(ledger.entry())
    found = slowest(entries)
    assert found is not None
    entry, ratio = found
    assert isinstance(entry, Entry) and entry.rank == 2
    assert ratio > 2.5
