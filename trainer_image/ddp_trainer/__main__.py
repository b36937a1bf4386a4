"""`python -m ddp_trainer` / `ddp-train`: parse the options, train, exit 0 / 1 / 2.

Exit codes: 0 training completed (or reached --target-accuracy), 1 failed (a clear message for
bad data, environment or checkpoints; a traceback only for bugs), 2 invalid options, 88
(`contract.EXIT_PEER_LOST`) a collective timed out or a peer went away, which the operator's
default rules retry.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ddp_trainer.contract import EXIT_PEER_LOST
from ddp_trainer.errors import TrainerError, is_peer_lost
from ddp_trainer.options import parse_argv

PROG = "ddp-train"


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_argv(argv, prog=PROG)  # exits 2 on a bad option, before torch is imported
    try:
        from torch.distributed.elastic.multiprocessing.errors import record

        from ddp_trainer.train import run
    except ModuleNotFoundError as exc:
        print(f"{PROG}: error: {exc}; install ddp-trainer[torch]", file=sys.stderr)
        return 1
    try:
        # record: under torchrun, the failure lands in the error file its summary shows.
        record(run)(options)
    except TrainerError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        if not is_peer_lost(exc):
            raise
        print(
            f"{PROG}: error: {exc}\n{PROG}: a collective timed out or a peer went away: "
            f"exiting {EXIT_PEER_LOST} so that the group restarts",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        # Not sys.exit: gloo's threads abort the interpreter's shutdown (SIGABRT), which would
        # hide this exit code.
        os._exit(EXIT_PEER_LOST)
    return 0


if __name__ == "__main__":
    sys.exit(main())
