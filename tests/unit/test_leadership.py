"""Leader election's pure parts: Lease records, expiry on the candidate's own clock, settings,
and what the probes report. The elector against the real API server, and the kill of a
leader process, are in tests/cluster/test_leader_election.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kube_ddp.cli import main
from kube_ddp.config import LeaseSettings
from kube_ddp.leadership import LeaseElector, claim, micro_time, release

T0 = datetime(2026, 11, 23, 16, 0, 0, 123456, tzinfo=UTC)
T1 = datetime(2026, 11, 23, 16, 0, 5, tzinfo=UTC)


def test_micro_time() -> None:
    assert micro_time(T0) == "2026-11-23T16:00:00.123456Z"


def test_claim_an_empty_lease() -> None:
    spec = claim({}, "a", 15, T0)
    assert spec == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-11-23T16:00:00.123456Z",
        "acquireTime": "2026-11-23T16:00:00.123456Z",
        "leaseTransitions": 0,
    }


def test_renew_keeps_acquire_time_and_transitions() -> None:
    renewed = claim(claim({}, "a", 15, T0), "a", 15, T1)
    assert renewed["acquireTime"] == micro_time(T0)
    assert renewed["renewTime"] == micro_time(T1)
    assert renewed["leaseTransitions"] == 0


def test_take_over_counts_a_transition() -> None:
    taken = claim(claim({}, "a", 15, T0), "b", 15, T1)
    assert (taken["holderIdentity"], taken["acquireTime"]) == ("b", micro_time(T1))
    assert taken["leaseTransitions"] == 1


def test_only_the_holder_releases() -> None:
    held = claim({}, "a", 15, T0)
    assert release(held, "b", T1) is None
    released = release(held, "a", T1)
    assert released is not None
    assert (released["holderIdentity"], released["leaseDurationSeconds"]) == ("", 1)


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"), [(10, 10, 2), (15, 10, 10), (15, 20, 2), (15, 10, 0)]
)
def test_settings_keep_retry_below_deadline_below_duration(
    duration: float, deadline: float, retry: float
) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseSettings(lease_duration=duration, renew_deadline=deadline, retry_period=retry)


def test_cli_refuses_bad_timing(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["operator", "--leader-election", "--lease-duration=5", "--renew-deadline=8"])
    assert code == 2
    assert "renew deadline < lease duration" in capsys.readouterr().err


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elector(clock: Clock, identity: str = "me") -> LeaseElector:
    settings = LeaseSettings(name="l", namespace="ns", identity=identity)
    return LeaseElector(kube=None, settings=settings, clock=clock)  # type: ignore[arg-type]


def test_a_live_holder_is_respected_for_its_duration_on_our_clock() -> None:
    clock = Clock()
    me = elector(clock)
    spec: dict[str, Any] = claim({}, "other", 15, T0)
    me._observe(spec)
    assert me._held_by_another(spec)
    clock.now += 14.9
    me._observe(spec)  # the same record: the holder did not renew
    assert me._held_by_another(spec)
    clock.now += 0.2
    assert not me._held_by_another(spec)


def test_a_renewal_restarts_the_wait_whatever_the_timestamps_say() -> None:
    clock = Clock()
    me = elector(clock)
    me._observe(claim({}, "other", 15, T1))
    clock.now += 14
    renewed = claim(claim({}, "other", 15, T1), "other", 15, T0)  # its clock is behind ours
    me._observe(renewed)
    clock.now += 14
    assert me._held_by_another(renewed)


def test_released_or_own_lease_is_free() -> None:
    me = elector(Clock())
    released = release(claim({}, "other", 15, T0), "other", T1)
    assert released is not None
    me._observe(released)
    assert not me._held_by_another(released)
    assert not me._held_by_another(claim({}, "me", 15, T0))
    assert me.holder is None


def test_readiness_means_watching_on_the_leader_and_following_on_a_standby() -> None:
    from kube_ddp.serving import Probes

    clock = Clock()
    me = elector(clock)
    probes = Probes(me)
    assert probes.readiness() == (False, "standby: the Lease has not been read yet")
    me._observe(claim({}, "other", 15, T0))
    assert probes.readiness() == (True, "standby: other leads")
    probes.acting = True
    assert probes.readiness()[0] is False
    probes.kopf_started.set()
    assert probes.readiness()[0] is False  # startup done, watches not yet spawned
    probes.insights.ready_resources.set()
    assert probes.readiness() == (True, "leader: watching")
    assert Probes(None).readiness()[0] is False


def test_operator_flags() -> None:
    from kube_ddp.cli import build_parser

    parse = build_parser().parse_args
    defaults = parse(["operator"])
    assert (defaults.log_format, defaults.leader_election) == ("full", False)
    assert (defaults.lease_duration, defaults.renew_deadline, defaults.retry_period) == (15, 10, 2)
    assert parse(["operator", "--json-logs"]).log_format == "json"
    assert parse(["operator", "--log-format=plain"]).log_format == "plain"
    with pytest.raises(SystemExit):
        parse(["operator", "--log-format=xml"])
    chosen = parse(["operator", "--leader-election", "--leader-election-id=x", "--retry-period=1"])
    assert (chosen.leader_election, chosen.leader_election_id, chosen.retry_period) == (
        True,
        "x",
        1.0,
    )


@pytest.mark.parametrize("api", ["hangs", "fails"])
def test_a_leader_that_cannot_renew_gives_up_by_its_renew_deadline(api: str) -> None:
    """Whether the API server never answers or fails at once, hold() returns at the renew
    deadline after the last renewal (not a retry period or a request timeout later): before
    the lease can expire for anyone else."""
    import asyncio
    import time

    class Unreachable:
        async def request(self, *_: Any) -> dict[str, Any]:
            if api == "hangs":
                await asyncio.sleep(3600)
            raise OSError("connection refused")

    settings = LeaseSettings(
        name="l",
        namespace="ns",
        identity="me",
        lease_duration=1.0,
        renew_deadline=0.3,
        retry_period=0.25,
    )
    leader = LeaseElector(Unreachable(), settings)  # type: ignore[arg-type]
    leader.leader, leader.holder = True, "me"
    leader._renewed_at = time.monotonic()

    async def held() -> float:
        await asyncio.wait_for(leader.hold(), timeout=5)
        return time.monotonic() - (leader._renewed_at or 0)

    elapsed = asyncio.run(held())
    assert 0.3 <= elapsed < 0.3 + 0.08, elapsed
    assert leader.leader is False
