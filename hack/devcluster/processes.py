"""Processes the cluster starts: spawned in their own session with a log each, recorded by pid
and full command line, and stopped only when both still match (pids get reused); plus the
polling and HTTP health checks that wait for them."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from devcluster.paths import LOGS, PKI, ClusterError, log


def process_matches(pid: int, argv: list[str]) -> bool:
    """True while `pid` is alive and still runs exactly `argv` (pids get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0")[:-1] == [arg.encode() for arg in argv]


class Component(TypedDict):
    name: str
    pid: int
    argv: list[str]


def is_alive(component: Component) -> bool:
    return process_matches(component["pid"], component["argv"])


def stop_component(component: Component, grace: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if not is_alive(component):
        return
    os.kill(component["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while is_alive(component) and time.monotonic() < deadline:
        time.sleep(0.05)
        reap(component["pid"])
    if is_alive(component):
        log(f"{component['name']} ignored SIGTERM for {grace:.0f} s; killing it")
        os.kill(component["pid"], signal.SIGKILL)
    reap(component["pid"])


def run(
    *argv: str,
    what: str | None = None,
    check: bool = True,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run a command to its end and return its output; when it fails (and `check`), raise
    ClusterError with `what` (default: the command) and the end of what it said."""
    result = subprocess.run(
        argv, capture_output=True, text=True, input=stdin, cwd=cwd, env=env, check=False
    )
    if check and result.returncode != 0:
        said = (result.stderr or result.stdout).strip()[-3000:]
        raise ClusterError(f"{what or ' '.join(argv)} failed: {said}")
    return result.stdout


def spawn(name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start one component in its own session, its output appended to LOGS/<name>.log."""
    return spawn_to(LOGS / f"{name}.log", argv, env)


def spawn_to(
    log_path: Path, argv: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session (it outlives `up`, and a ^C in the terminal), its output
    appended to `log_path`."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def reap(pid: int) -> None:
    # When `up` ran in this very process (the pytest fixture), its children linger as zombies.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def tls_context(*, verify: bool = True) -> ssl.SSLContext:
    if not verify:  # the controller manager and scheduler serve self-signed health endpoints
        return ssl._create_unverified_context()
    context = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    context.load_cert_chain(PKI / "admin.crt", PKI / "admin.key")
    return context


def http_get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), b""
    except (OSError, ssl.SSLError):
        return 0, b""


def wait_until(
    what: str,
    ready: Callable[[], object],
    timeout: float,
    watch: dict[str, subprocess.Popen[bytes]],
    logs: Path = LOGS,
) -> None:
    """Poll `ready()` until it is true; fail early when a watched process exits (with the end
    of its log, logs/<name>.log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        for name, process in watch.items():
            if process.poll() is not None:
                raise ClusterError(
                    f"{name} exited with {process.returncode} while waiting for {what}:\n"
                    + tail(logs / f"{name}.log")
                )
        time.sleep(0.1)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}; logs: {logs}")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def is_healthy(url: str, context: ssl.SSLContext | None = None) -> bool:
    return http_get(url, context)[0] == 200


def start_until_up(
    name: str,
    start: Callable[[], subprocess.Popen[bytes]],
    up: Callable[[subprocess.Popen[bytes]], None],
    flaky: str,
    tries: int,
    logs: Path = LOGS,
) -> subprocess.Popen[bytes]:
    """Start `name` and wait until `up(process)` returns; started again, saying why, when it
    exited having logged `flaky` (a known race at its start), at most `tries` times in all."""
    for attempt in range(1, tries + 1):
        log_path = logs / f"{name}.log"
        before = log_path.stat().st_size if log_path.exists() else 0
        process = start()
        try:
            up(process)
            return process
        except ClusterError:
            with open(log_path, "rb") as log_file:
                log_file.seek(before)
                said = log_file.read().decode(errors="replace")
            if process.poll() is None or flaky not in said or attempt == tries:
                raise
            log(f"{name} exited at start with '{flaky}', a race of its own: starting it again")
    raise AssertionError("unreachable")
