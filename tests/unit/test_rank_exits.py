"""Which failed rank caused the others, and its end as an exit code (ddp_trainer.rank_exits),
on torchrun's failures as plain values: no torch is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddp_trainer.contract import EXIT_PEER_LOST, EXIT_TEMPORARY
from ddp_trainer.rank_exits import cause, exit_code, how_it_ended


@dataclass
class Failure:
    """The two fields of torch's ProcessFailure that the cause is read from."""

    exitcode: int
    timestamp: int


def failures(*ended: tuple[int, Failure]) -> Any:
    return dict(ended)


def test_the_cause_is_the_killed_rank_not_the_peer_that_saw_it_die_first() -> None:
    """torchrun's first failure is by time in whole seconds: a healthy rank's lost-peer exit
    can be written down before its killed peer is noticed."""
    assert cause(failures((0, Failure(EXIT_PEER_LOST, 10)), (1, Failure(-9, 11))))[0] == 1
    assert cause(failures((0, Failure(EXIT_PEER_LOST, 10)), (1, Failure(1, 11))))[0] == 1
    assert cause(failures((0, Failure(78, 12)), (1, Failure(1, 11))))[0] == 1
    # torchrun lists the ranks it stopped itself after the one that failed
    assert cause(failures((1, Failure(1, 11)), (0, Failure(-15, 11))))[0] == 1


def test_a_signal_is_an_exit_code_above_128_and_said_by_name() -> None:
    assert exit_code(-9) == 137 and exit_code(EXIT_TEMPORARY) == EXIT_TEMPORARY
    assert how_it_ended(-9) == "was killed by SIGKILL"
    assert how_it_ended(1) == "exited with code 1"
    assert how_it_ended(-99) == "was killed by signal 99"
