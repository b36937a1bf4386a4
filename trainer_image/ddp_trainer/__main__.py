"""`python -m ddp_trainer` / `ddp-train`: parse the options, train, exit with a code that says why.

Exit codes (`ddp_trainer.contract`, read by the operator's failure rules): 0 training
completed (or reached --target-accuracy), 1 bad data, model or checkpoint, 2 invalid options,
75 a download failed (retried), 78 a path cannot be used (permissions, full disk, missing: fix
the job's volumes), 86 stopped on SIGTERM after saving a checkpoint (resumed, not a failure),
88 a collective timed out or a peer went away (retried). Each is one line
naming what and how to fix it; a traceback only for bugs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import NoReturn

from ddp_trainer.contract import EXIT_FAILED, EXIT_PREEMPTED
from ddp_trainer.errors import (
    TrainerError,
    end_process,
    exit_peer_lost,
    is_peer_lost,
    storage_error,
)
from ddp_trainer.options import parse_argv
from ddp_trainer.preemption import Preemption
from ddp_trainer.torch_floor import too_old

PROG = "ddp-train"


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_argv(argv, prog=PROG)  # exits 2 on a bad option, before torch is imported
    # SIGTERM from here on exits 86; once training runs, after a checkpoint at an agreed step.
    preemption = Preemption(options.stop_check_steps, timedelta(seconds=options.timeout_seconds))
    try:
        from torch.distributed.elastic.multiprocessing.errors import record

        from ddp_trainer.train import PreemptedError, run
    except ModuleNotFoundError as exc:
        print(f"{PROG}: error: {exc}; install ddp-trainer[torch]", file=sys.stderr)
        return 1
    import torch

    if (old := too_old(torch.__version__)) is not None:
        print(f"{PROG}: error: {old}", file=sys.stderr)
        return EXIT_FAILED
    try:
        # record: under torchrun, the failure lands in the error file its summary shows.
        record(run)(options, preemption)
    except PreemptedError as exc:
        print(f"{PROG}: {exc}: exiting {EXIT_PREEMPTED} (resume, not a failure)", file=sys.stderr)
        return EXIT_PREEMPTED
    except TrainerError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        if is_peer_lost(exc):
            exit_peer_lost(PROG, exc)
        if not isinstance(exc, OSError) or exc.filename is None:
            raise  # not about a path: a bug, shown with its traceback
        error = storage_error(exc)
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


def entry() -> NoReturn:
    """`python -m ddp_trainer` and the `ddp-train` script: main's code, as `end_process` ends."""
    end_process(main())


if __name__ == "__main__":
    entry()
