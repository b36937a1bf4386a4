"""What the tiers build (Go binaries, the operator's image), built in one background thread
while the tiers that need none of it run first, and the order of the tiers.

A tier's conftest plans its builds when collection ends (`BUILDS.plan`); tests/conftest.py
starts them as the tests start, one after another in the order of the tiers that need them, and
waits for those a test needs before the test (`BUILDS.wait_for`, outside its timeout). A
fixture takes a build's error with `BUILDS.wait(name)`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import pytest

TESTS = Path(__file__).resolve().parent
# What each tier needs, least first: a test outside them runs after them, in its own order.
TIER_ORDER = ("unit", "trainer", "cluster", "e2e")
T = TypeVar("T")


def tier_of(path: Path, tests: Path = TESTS) -> str:
    """tests/<tier>/..., or "" for a path outside tests/."""
    return path.relative_to(tests).parts[0] if path.is_relative_to(tests) else ""


def tier_rank(tier: str) -> int:
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


# Set by a tier's conftest on the tests of a module that waits for a build of its own (an
# add-on): its tier runs the modules that wait for none first, while a cold cache builds.
WAITS_FOR_A_BUILD = pytest.StashKey[bool]()


def in_tier_order(
    items: Sequence[T],
    path: Callable[[T], Path],
    tests: Path = TESTS,
    last: Callable[[T], bool] = lambda item: False,
    waits: Callable[[T], bool] = lambda item: False,
) -> list[T]:
    """`items` sorted by tier, the `last` ones of a tier after the rest of it, and before
    those, the ones that `waits` for a build after the others (stable: a tier's tests keep
    their order otherwise)."""
    return sorted(
        items,
        key=lambda item: (tier_rank(tier_of(path(item), tests)), last(item), waits(item)),
    )


@dataclass
class Build:
    name: str
    tier: str  # the first tier that needs it: builds run in tier order
    run: Callable[[], None]
    needed_by: Callable[[pytest.Item], bool]
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class Builds:
    """Planned builds, run one after another in a daemon thread once started."""

    def __init__(self) -> None:
        self.planned: list[Build] = []
        self.thread: threading.Thread | None = None

    def plan(
        self, name: str, tier: str, run: Callable[[], None], needed_by: Callable[[Any], bool]
    ) -> None:
        self.planned.append(Build(name, tier, run, needed_by))

    def start(self, prepare_thread: Callable[[], None] = lambda: None) -> None:
        """Run the planned builds in the background, in tier order; `prepare_thread` first,
        in that thread (where the builds' log lines go, say)."""
        if self.thread is not None or not self.planned:
            return
        self.planned.sort(key=lambda build: tier_rank(build.tier))
        self.thread = threading.Thread(
            target=self._run_all, args=(prepare_thread,), name="background-builds", daemon=True
        )
        self.thread.start()

    def _run_all(self, prepare_thread: Callable[[], None]) -> None:
        try:
            prepare_thread()
        except Exception as error:  # every build ends with it: none hangs its waiters
            for build in self.planned:
                build.error = f"the background builds did not start: {error!r}"
                build.done.set()
            return
        for build in self.planned:
            try:
                build.run()
            except Exception as error:  # whatever it is, the tests that need the build say it
                build.error = str(error) or repr(error)
            finally:
                build.done.set()

    def wait(self, name: str) -> str | None:
        """The error of the build `name` once it has ended (None: it succeeded, or it was
        never planned). Unstarted builds are started here (a fixture used outside a session's
        test loop)."""
        build = next((b for b in self.planned if b.name == name), None)
        if build is None:
            return None
        self.start()
        build.done.wait()
        return build.error

    def needed(self, item: pytest.Item) -> list[Build]:
        """The builds `item` needs that have not ended yet."""
        return [b for b in self.planned if not b.done.is_set() and b.needed_by(item)]

    def wait_for(self, item: pytest.Item, say: Callable[[str], None]) -> None:
        pending = self.needed(item)
        if not pending:
            return
        started = time.monotonic()
        say(f"waiting for the background builds: {', '.join(b.name for b in pending)}")
        for build in pending:
            self.wait(build.name)
        say(f"background builds: waited {time.monotonic() - started:.0f} s")

    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


BUILDS = Builds()


def session_stderr() -> TextIO:
    """A stream to the session's own stderr, taken while pytest captures nothing (between
    collection and the first test): what a background thread writes there reaches the
    terminal (CI's log) even while a test's output is captured."""
    return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")


def uses_module(item: pytest.Item, module: str) -> bool:
    """Whether the test's module holds something of `module` (a class or function it imported)."""
    found = getattr(item, "module", None)
    values: Iterable[object] = vars(found).values() if found is not None else ()
    return any(getattr(value, "__module__", None) == module for value in values)
