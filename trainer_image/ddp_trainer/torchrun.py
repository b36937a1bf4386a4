"""torchrun that ends as its failed rank ended: `python -m ddp_trainer.torchrun <torchrun args>`.

torchrun exits 1 whatever ended a rank, so a rank SIGKILLed (by the OOM killer or a person), a
download that failed (75) and a lost peer (88) all read as a program error. This runs torchrun's
own `main` in this process and, when a rank failed, exits with the exit code of the rank whose
failure caused the others, or 128 + the signal that killed it, as a shell reports a child of its
own. The operator's failure rules then judge the rank's own end (docs/design.md, "Failure
rules").

SIGTERM to this process (the kubelet stopping the pod) is passed on to the ranks by torchrun,
which then waits for them: the trainer's ranks save a checkpoint and exit 86
(contract.EXIT_PREEMPTED), and so does this process when every rank did, not 143. The
wait is as long as the ranks take (contract.SHUTDOWN_TIMEOUT_ENV).
A rank that runs a script (`torchrun train.py`, not `-m` nor `--no-python`) runs it under
`ddp_trainer.script`: as python runs it, ended without the interpreter's teardown, in which a
rank that trained to its end can abort (exit 134) while gloo's threads still run.
Standard library and torch only: it runs in any image that has both and this package.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_trainer import agent, contract
from ddp_trainer.contract import EXIT_FAILED, EXIT_PEER_LOST, EXIT_PREEMPTED, SIGNALLED
from ddp_trainer.rank_exits import PROG, cause, exit_code, how_it_ended
from ddp_trainer.torch_floor import too_old

SCRIPT_RUNNER = "ddp_trainer.script"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault(contract.SHUTDOWN_TIMEOUT_ENV, str(contract.SHUTDOWN_TIMEOUT_S))
    os.environ.setdefault(contract.OWN_WORKER_STORE_ENV, "1")
    from torch.distributed.run import parse_args

    return _run(parse_args(argv))  # type: ignore[no-untyped-call]


def _run(args: Any) -> int:
    import torch

    if (old := too_old(torch.__version__)) is not None:  # before torch's internals are read
        print(f"{PROG}: error: {old}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import run

    from ddp_trainer import elastic  # torch's elastic agent: once torch may be imported

    args.rdzv_conf = agent.with_fast_rendezvous(args.rdzv_conf or "")
    run_script_ended_cleanly(args, os.environ)
    hooks = elastic.Hooks(agent.Rules.from_env(os.environ), os.environ)
    with_hooks: contextlib.AbstractContextManager[None]
    if lacks := elastic.missing():
        print(
            f"{PROG}: torch {torch.__version__} lacks what kube-ddp's agent relies on "
            f"({', '.join(lacks)}): torch's own agent runs, without restarts in place",
            file=sys.stderr,
        )
        args.max_restarts = 0
        with_hooks = contextlib.nullcontext()
    else:
        with_hooks = elastic.running(hooks, agent.rendezvous_poll_s(args.nnodes))
    try:
        with with_hooks:
            record(run)(args)
    except ChildFailedError as exc:
        rank, failure = cause(exc.failures)
        code = exit_code(failure.exitcode)
        # One line per failed rank, then why this process ends with the code it does. Not
        # torchrun's summary, whose tracebacks the ranks have printed already: the kubelet keeps
        # only the log's last 2 KB as the pod's failure message, and the ranks' own last
        # lines (which rank stopped first) must stay in it.
        for failed, ended in exc.failures.items():
            said = f"{PROG}: rank {failed} (local rank {ended.local_rank}, pid {ended.pid}) "
            print(said + how_it_ended(ended.exitcode), file=sys.stderr)
        print(
            f"{PROG}: rank {rank} {how_it_ended(failure.exitcode)} first: exiting {code}",
            file=sys.stderr,
            flush=True,
        )
        return code
    except SignalException as exc:  # torchrun itself was told to stop (the pod is deleted)
        stopped = hooks.stopped
        if stopped and all(code == EXIT_PREEMPTED for code in stopped):
            print(
                f"{PROG}: stopped by {signal.Signals(exc.sigval).name}; every local rank "
                f"exited {EXIT_PREEMPTED} (preempted, saved): exiting {EXIT_PREEMPTED}",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_PREEMPTED
        return SIGNALLED + int(exc.sigval)
    except (RendezvousError, DistError) as exc:  # the store is gone, or the peers did not come
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(
            f"{PROG}: the rendezvous failed ({reason}): exiting {EXIT_PEER_LOST}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PEER_LOST
    return 0


def run_script_ended_cleanly(args: Any, env: Mapping[str, str]) -> None:
    """Have each rank run a script (not a module, not a program) under `ddp_trainer.script`,
    which ends it without the interpreter's teardown that can abort a finished rank; unless
    PYTHON_EXEC names another interpreter, which may not have this package."""
    if args.module or args.no_python or args.run_path or env.get("PYTHON_EXEC"):
        return
    args.training_script_args = [args.training_script, *args.training_script_args]
    args.training_script = SCRIPT_RUNNER
    args.module = True


if __name__ == "__main__":
    sys.exit(main())
