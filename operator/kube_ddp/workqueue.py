"""A work queue of job keys, as Kubernetes controllers keep one.

A key is never reconciled twice at once; a key enqueued while it is being reconciled is
reconciled once more afterwards; enqueueing a waiting key again does nothing. This turns any
number of pod and job events into one reconcile per job, as soon as a worker is free.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, handle: Callable[[K], Awaitable[None]], workers: int) -> None:
        self._handle = handle
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()
        self._busy: set[K] = set()
        self._again: set[K] = set()
        self._batched: set[K] = set()
        self._tasks = [asyncio.create_task(self._work()) for _ in range(workers)]

    def add(self, key: K, after: float = 0.0) -> None:
        """Queue `key` now, or after `after` seconds."""
        if after > 0:
            asyncio.get_running_loop().call_later(after, self.add, key)
            return
        if key in self._busy:
            self._again.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._queue.put_nowait(key)

    def add_batched(self, key: K, window: float) -> None:
        """Queue `key` in `window` seconds, folding every call until then into that one: a
        burst of pod events becomes one reconcile (and one status write) per job."""
        if key in self._waiting or key in self._batched:
            return
        self._batched.add(key)
        asyncio.get_running_loop().call_later(window, self._release, key)

    def _release(self, key: K) -> None:
        self._batched.discard(key)
        self.add(key)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._waiting.discard(key)
            self._busy.add(key)
            try:
                await self._handle(key)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The handler reports its own errors; a crash must not kill the worker.
                log.exception("reconciling %s failed", key)
            finally:
                self._busy.discard(key)
                if key in self._again:
                    self._again.discard(key)
                    self.add(key)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
