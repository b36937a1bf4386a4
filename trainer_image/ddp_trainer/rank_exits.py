"""How a failed group's ranks ended, read from torchrun's failures: the rank that caused the
others, and its end as a process's exit code (128 + n for a signal n, as a shell reports it).

Both the launcher (`ddp_trainer.torchrun`, which exits as that rank did) and the pod's agent
(`ddp_trainer.agent`, which judges that rank by the job's failure rules) read an end this way.
Standard library only; torch's ProcessFailure is read, never imported at run time.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ddp_trainer.contract import EXIT_PEER_LOST, SIGNALLED

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

# The name the launcher and its agent print their lines under (the pod's log).
PROG = "ddp_trainer.torchrun"


def cause(failures: Mapping[int, ProcessFailure]) -> tuple[int, ProcessFailure]:
    """The failed rank that caused the others. Not torchrun's own first failure: its times have
    a resolution of a second, and a healthy rank that saw its peer die may be written down
    before the killed one is noticed. So: a rank torchrun stopped itself (SIGTERM, once one had
    failed; it lists them too) last; then a rank killed by a signal, then one that did not exit
    for a lost peer (its peers' collectives broke because of it); then the earliest, and within
    a second, the one torchrun saw first (its failures are listed in the order it saw them)."""
    ranked = [
        (
            failure.exitcode == -signal.SIGTERM,
            failure.exitcode >= 0,
            failure.exitcode == EXIT_PEER_LOST,
            failure.timestamp,
            position,
            rank,
        )
        for position, (rank, failure) in enumerate(failures.items())
    ]
    rank = min(ranked)[-1]
    return rank, failures[rank]


def exit_code(rank_exit: int) -> int:
    """A rank's end as its own process's exit code: torch reports a signal n as -n."""
    return SIGNALLED - rank_exit if rank_exit < 0 else rank_exit


def how_it_ended(rank_exit: int) -> str:
    """A rank's end in words, for torch's report of it (a signal n as -n)."""
    if rank_exit >= 0:
        return f"exited with code {rank_exit}"
    try:
        name = signal.Signals(-rank_exit).name
    except ValueError:
        name = f"signal {-rank_exit}"
    return f"was killed by {name}"
