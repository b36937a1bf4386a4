"""A worker pod as a local process, seen by the status core as the PodView a real pod gives.

Each worker runs in its own session (process group), so stopping it reaches whatever it
started (DataLoader processes), and a Ctrl-C at the terminal reaches only the runner, which
then stops every group itself. torchrun starts its ranks in sessions of their own: a worker's
descendants, found when it is stopped, are killed with it (a container's end takes every
process in it; here a hung rank would outlive its killed agent).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kube_ddp import names
from kube_ddp.local.plan import WorkerLaunch
from kube_ddp.status import PodView

# What the container runtime reports for a command it cannot start (containerd: StartError).
START_ERROR_EXIT_CODE = 128
LAST_LINE_CHARS = 2048  # of a termination message: the kubelet's 2048 bytes of log
PUMP_DRAIN_S = 1.0  # for the last lines after an exit (a descendant may hold the pipe open)

LineSink = Callable[[WorkerLaunch, str], None]


def exit_code_of(returncode: int) -> int:
    """A container's exit code: 128 + the signal for a process killed by one (137: SIGKILL)."""
    return 128 - returncode if returncode < 0 else returncode


class LocalPod:
    """One worker process and its lifecycle: Running, then Succeeded or Failed; deleted by
    stop() (SIGTERM to its group, SIGKILL after the grace period)."""

    def __init__(self, launch: WorkerLaunch, on_line: LineSink, on_exit: Callable[[], None]):
        self.launch = launch
        self._on_line = on_line
        self._on_exit = on_exit
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.exit_code: int | None = None
        self.reason: str | None = None
        self.message: str | None = None
        self.started_at = time.monotonic()
        # creationTimestamp: what the rules compare reports with (a report older than the pods
        # is an earlier group's)
        self.created_at = datetime.now(UTC).isoformat()
        self.ended_at: float | None = None
        self.finished_at: str | None = None  # the moment it ended, as a sortable timestamp
        self.stop_requested_at: float | None = None
        self._threads: list[threading.Thread] = []
        self._descendants: dict[int, str] = {}  # pid: start time, seen while it was stopped
        self._last_line = ""  # the pod's termination message on a failure, as on a cluster

    @property
    def name(self) -> str:
        return self.launch.pod

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def start(self) -> None:
        try:
            self._process = subprocess.Popen(
                self.launch.argv,
                env=self.launch.env,
                cwd=self.launch.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as error:
            self._ended(START_ERROR_EXIT_CODE, "StartError", f"{self.launch.argv[0]}: {error}")
            return
        for target, role in ((self._pump, "log"), (self._wait, "wait")):
            thread = threading.Thread(target=target, name=f"{self.name}-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _wait(self) -> None:
        assert self._process is not None
        code = exit_code_of(self._process.wait())
        pump = next((t for t in self._threads if t.name.endswith("-log")), None)
        if pump is not None:  # its last lines are still in the pipe
            pump.join(timeout=PUMP_DRAIN_S)
        # The worker's last words, as a cluster's FallbackToLogsOnError gives its pod's.
        message = self._last_line[:LAST_LINE_CHARS] if code and self._last_line else None
        self._ended(code, "Completed" if code == 0 else "Error", message)

    def _ended(self, code: int, reason: str, message: str | None) -> None:
        with self._lock:
            self.ended_at = time.monotonic()
            self.finished_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            self.reason, self.message = reason, message
            self.exit_code = code
        self._on_exit()

    def _pump(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for raw in self._process.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if line.strip():
                self._last_line = line.strip()
            self._on_line(self.launch, line)

    def view(self) -> PodView:
        with self._lock:
            code = self.exit_code
            phase = "Running" if code is None else "Succeeded" if code == 0 else "Failed"
            return PodView(
                name=self.name,
                index=self.launch.index,
                attempt=self.launch.attempt,
                phase=phase,
                deleting=self.stop_requested_at is not None,
                exit_code=code,
                reason=self.reason if code else None,
                message=self.message,
                finished_at=self.finished_at,
                scheduled=True,
                created_at=self.created_at,
                owner_uid=self.launch.owner_uid,
                owner_kind=names.KIND,
            )

    def stop(self) -> None:
        """Delete the pod: SIGTERM now to the whole group; kill_if_overdue() does the rest."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            self._note_descendants()
            self._signal(signal.SIGTERM)

    def kill_if_overdue(self, grace_s: float) -> None:
        stopping = self.stop_requested_at is not None and self.alive
        if stopping and time.monotonic() - (self.stop_requested_at or 0) >= grace_s:
            self._note_descendants()
            self._signal(signal.SIGKILL)

    def reap(self, timeout_s: float = 5.0) -> None:
        """After the process ended: kill what its group left behind, drain its log, and wait
        (at most `timeout_s`) until the killed descendants are gone: a SIGKILL takes effect
        when the kernel next runs that process, and the runner's end must find none running."""
        self._signal(signal.SIGKILL)
        for thread in self._threads:
            thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self._running_descendants() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _running_descendants(self) -> list[int]:
        """Those killed that are still that process (not a reused pid) and not yet a zombie
        (Z) or dead (X)."""
        running = []
        for pid, started in self._descendants.items():
            fields = _stat(pid)
            if fields and fields[19] == started and fields[0] not in ("Z", "X"):
                running.append(pid)
        return running

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is None:
            return
        # Its session's id is its pid; once the whole group is gone there is nothing to do.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)
        if signum == signal.SIGKILL:
            for pid, started in self._descendants.items():
                if _start_time(pid) == started:  # still that process, not a reused pid
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signum)

    def _note_descendants(self) -> None:
        """Remember the processes below the worker while they are still its descendants
        (orphaned, they could no longer be told apart)."""
        if self._process is None:
            return
        unseen = _children(self._process.pid)
        while unseen:
            pid = unseen.pop()
            started = _start_time(pid)
            if started is not None and pid not in self._descendants:
                self._descendants[pid] = started
                unseen.extend(_children(pid))


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(child) for child in f.read().split())
    return found


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3, the state, first)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    fields = _stat(pid)
    return fields[19] if fields else None
