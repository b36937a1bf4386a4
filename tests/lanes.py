"""`make test`: every tier, in two pytest sessions side by side (lanes).

The trainer tier touches no cluster and keeps the CPU busy (a mean load of 3.4 on 2 cores);
the cluster tier mostly waits on the control plane and kwok (0.9). So the lane beside the rest
runs the trainer tier, then the cluster tier's longest waiters on a control plane of its own
(a state directory of its own, so its API server restarts and faults touch nothing of the other
lane); the other lane, started at once, runs the unit tier (while a new machine builds the
control plane), the rest of the cluster tier and the e2e tier, whose real node and
chart-installed operator (watching every namespace) there is one of. Each lane's cold builds
(tests/background_builds.py) take the CPU the other leaves; a component is built once (a lock
each).

The rest's output streams; the other lane's goes to a file, said in one line when it ends and
printed whole after the rest (two live progress lines would interleave). The run passes only if
both lanes do; the arguments are given to each session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# What the lane beside the rest runs: the trainer tier, then cluster modules that mostly wait
# (progress deadlines, lost nodes, the soak's faults, the benchmark's peers) and need nothing
# there is one of per machine. On a new machine the rest waits for the control plane's build at
# its start, which this lane reaches after the trainer tier: the unit tier there and the
# benchmark's module here balance the two.
BESIDE = (
    "trainer",
    "cluster/test_lifecycle.py",
    "cluster/test_soak.py",
    "cluster/test_bench.py",
)
# Its control plane's state directory (hack/devcluster/paths.py), under the repository.
BESIDE_STATE_DIR = ".cluster-beside"


@dataclass(frozen=True)
class Lane:
    name: str
    paths: tuple[str, ...]  # pytest's arguments that choose its tests
    env: Mapping[str, str] = field(default_factory=dict)


def lanes(tests: Path = TESTS) -> tuple[Lane, Lane]:
    """The streamed lane (every test not BESIDE, wherever it lies), then the one beside."""
    beside = tuple(str(tests / path) for path in BESIDE if (tests / path).exists())
    rest = (str(tests), *(f"--ignore={path}" for path in beside))
    state_dir = str(tests.parent / BESIDE_STATE_DIR)
    # The rest's first tests wait for the control plane's build on a new machine: its builds
    # take the CPU at the tests' own priority, where the lane beside's yield it.
    return (
        Lane("the rest", rest, {"KUBEDDP_BUILD_NICE": "0"}),
        Lane("beside", beside, {"KUBEDDP_STATE_DIR": state_dir}),
    )


@dataclass
class Ended:
    lane: Lane
    returncode: int
    seconds: float


def run(arguments: Sequence[str], tests: Path = TESTS, python: str = sys.executable) -> int:
    streamed, beside = lanes(tests)
    print(f"lane {beside.name}: {' '.join(BESIDE)}; lane {streamed.name}: every other test")
    with tempfile.TemporaryDirectory(prefix="kube-ddp-lanes-") as scratch:
        log_path = Path(scratch) / "beside.log"
        command = [python, "-m", "pytest", *arguments]
        started = time.monotonic()
        with open(log_path, "wb") as log:
            quiet = subprocess.Popen(
                [*command, *beside.paths],
                stdout=log,
                stderr=log,
                env={**os.environ, **beside.env},
            )
            loud = subprocess.Popen([*command, *streamed.paths], env={**os.environ, **streamed.env})
            ended = _wait(loud, quiet, streamed, beside, started)
        print(f"\n===== lane {beside.name}: its session's output =====", flush=True)
        sys.stdout.buffer.write(log_path.read_bytes())
        sys.stdout.flush()
    for end in ended:
        print(f"lane {end.lane.name}: exit {end.returncode} in {end.seconds:.0f} s", flush=True)
    return next((end.returncode for end in ended if end.returncode != 0), 0)


def _wait(
    loud: subprocess.Popen[bytes],
    quiet: subprocess.Popen[bytes],
    streamed: Lane,
    beside: Lane,
    started: float,
) -> list[Ended]:
    """Both lanes' ends; the quiet one's said as it happens. A SIGTERM here reaches both
    sessions as a ^C, so that each tears down what it started (a cluster, the real node);
    a ^C at the terminal reaches them already (one process group), and is not sent twice."""
    processes = {streamed.name: loud, beside.name: quiet}

    def forward(signum: int, _: object) -> None:
        for process in processes.values():
            if process.poll() is None and signum == signal.SIGTERM:
                process.send_signal(signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ended: dict[str, Ended] = {}
        while len(ended) < 2:
            for lane in (streamed, beside):
                code = processes[lane.name].poll()
                if code is not None and lane.name not in ended:
                    ended[lane.name] = Ended(lane, code, time.monotonic() - started)
                    if lane is beside:
                        print(
                            f"\nlane {beside.name}: ended (exit {code}) in "
                            f"{ended[lane.name].seconds:.0f} s; its output follows the rest's",
                            flush=True,
                        )
            time.sleep(0.5)
        return [ended[streamed.name], ended[beside.name]]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
