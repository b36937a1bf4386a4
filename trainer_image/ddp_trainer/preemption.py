"""SIGTERM as "stop at a step every rank agrees on": what the kubelet sends on a suspend, a
Kueue eviction, a drain or the operator's own group restart, before it kills the pod at the
end of its grace period.

The trainer uses it, and so can a program of your own, in a few lines:

    from ddp_trainer.preemption import Preemption

    preemption = Preemption()             # before or after init_process_group
    for step in ...:
        train_one_step()
        if preemption.stop_requested():   # on every rank, at the same steps: a collective
            if dist.get_rank() == 0:
                save_checkpoint(step)
            preemption.exit()             # every rank exits 86: resume, not a failure
    preemption.close()                    # the last check's all-reduce, before the group goes
    dist.destroy_process_group()

SIGTERM only sets a flag; `stop_requested` all-reduces it (MAX, on a gloo group of its own, so
a GPU job's step is not synchronised with its device; in the background, read at the next
check), so every rank stops after the same step, even though the signal reaches them at
different moments. A process that gets SIGTERM
before its process group exists has nothing to save and exits 86 at once. Where a step is
far shorter than the all-reduce, `every_steps` checks less often; the trainer's
`--stop-check-steps` is the same setting.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta
from types import FrameType
from typing import Any, NoReturn

from ddp_trainer import contract
from ddp_trainer.contract import EXIT_PREEMPTED
from ddp_trainer.errors import end_process

# How long `close` waits for gloo's worker to let go of the last check's tensor: microseconds
# on a quiet machine, a scheduling delay under load.
GLOO_RELEASE_SECONDS = 5.0


class Preemption:
    """SIGTERM turned into a stop that all ranks agree on at a step boundary."""

    def __init__(self, every_steps: int = 1, timeout: timedelta | None = None) -> None:
        """`timeout`: of the agreement's collectives (torch's default for gloo when None)."""
        self.every_steps = every_steps
        self.timeout = timeout
        self.requested = False  # this process got SIGTERM
        self._calls = 0
        self._group: Any = None  # the gloo group of the agreement, made on first use
        self._pending: tuple[Any, Any] | None = None  # the all-reduce in flight, its flags
        self._due = False  # said since the last all-reduce was sent
        self._grouped = False  # a process group has existed: training began
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._watch_while_blocked()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self._exit_if_no_group()

    def _exit_if_no_group(self) -> None:
        # Not imported (or half imported) yet: no group either.
        is_initialized = getattr(sys.modules.get("torch.distributed"), "is_initialized", None)
        self._grouped |= is_initialized is not None and is_initialized()
        # A group already destroyed: training is over and the process about to end as it
        # ended (a finished job's last workers are stopped this way), not as preempted.
        if not self._grouped and not self._single_process():
            # No group yet: nothing trained, nothing to save.
            print("SIGTERM before training started: exiting", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_PREEMPTED)

    def _watch_while_blocked(self) -> None:
        """Python runs a signal handler only between bytecodes of the main thread, and
        init_process_group waits for its peers in C++ that retries on EINTR: a thread woken
        by the signal's wakeup byte makes the early exit happen there too."""
        reader, writer = os.pipe()
        os.set_blocking(writer, False)
        signal.set_wakeup_fd(writer, warn_on_full_buffer=False)

        def watch() -> None:
            while True:
                woken = os.read(reader, 64)
                if signal.SIGTERM in woken:
                    self.requested = True
                    self._exit_if_no_group()

        threading.Thread(target=watch, name="sigterm-watch", daemon=True).start()

    @staticmethod
    def _single_process() -> bool:
        return int(os.environ.get(contract.WORLD_SIZE, "1")) == 1

    def stop_requested(self) -> bool:
        """Whether any rank got SIGTERM, the same answer on every rank: call it on every rank
        after every step. Every `every_steps`-th call answers what the previous such call
        sent and sends the flag again; the others answer False."""
        return self.agree(due=False)[0]

    def agree(self, due: bool) -> tuple[bool, bool]:
        """(any rank got SIGTERM, any rank said `due`), the same on every rank. The trainer
        says whether rank 0's timed checkpoint is due, so one all-reduce carries both; `due`
        is kept until it is sent.

        The all-reduce runs in the background (async, on a gloo group of its own) while the
        next steps compute, and is read at the next check: a stop comes one check after the
        signal, and the check costs no wait for the other ranks."""
        self._due = self._due or due
        self._calls += 1
        if self._calls % self.every_steps:
            return False, False
        dist = _distributed()
        self._grouped |= dist.is_initialized()
        if not dist.is_initialized() or dist.get_world_size() == 1:
            sent, self._due = self._due, False
            return self.requested, sent
        import torch

        agreed = (False, False)
        if self._pending is not None:
            work, flags = self._pending
            work.wait()
            stop, agreed_due = (bool(value) for value in flags.tolist())
            agreed = (stop, agreed_due)
        flags = torch.tensor([float(self.requested), float(self._due)])
        self._due = False
        group = self._cpu_group(dist)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group, async_op=True)
        self._pending = (work, flags)
        return agreed

    def close(self) -> None:
        """Waits for the all-reduce in flight: call it before destroy_process_group, which
        shuts the agreement's group down under it. The collective's tensor is let go only
        after gloo's worker thread let go of it: `wait` returns as the work completes, before
        that thread drops its references, and one that drops the last while the interpreter
        finalizes needs a GIL that is gone (std::terminate: SIGABRT's 134 after a run that
        finished, `errors.end_process`)."""
        if self._pending is None:
            return
        work, flags = self._pending
        self._pending = None
        work.wait()
        del work  # its hold on the tensor goes with the worker's
        deadline = time.monotonic() + GLOO_RELEASE_SECONDS
        while flags._use_count() > 1 and time.monotonic() < deadline:
            time.sleep(0.001)

    def _cpu_group(self, dist: Any) -> Any:
        if self._group is None:  # its own: DDP's collectives never queue behind it
            self._group = dist.new_group(backend="gloo", timeout=self.timeout)
        return self._group

    def exit(self) -> NoReturn:
        """Every rank waits for the others (rank 0's save among them), then exits 86, as
        `end_process` ends: a script's DDP model still holds the group, and gloo could turn
        the interpreter's teardown into SIGABRT's 134 (a failure, not a preemption)."""
        dist = _distributed()
        if dist.is_initialized():
            self.close()
            dist.barrier(group=self._cpu_group(dist))
            dist.destroy_process_group()
        end_process(EXIT_PREEMPTED)


def _distributed() -> Any:
    """torch.distributed, imported when first needed: importing this module stays cheap."""
    import torch.distributed as dist

    return dist


__all__ = ["EXIT_PREEMPTED", "Preemption"]
