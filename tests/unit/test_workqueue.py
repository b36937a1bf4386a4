"""The work queue: one reconcile at a time per key, nothing lost, bursts folded."""

from __future__ import annotations

import asyncio

from kube_ddp.workqueue import WorkQueue


def test_a_key_is_never_handled_twice_at_once_and_never_lost() -> None:
    async def scenario() -> tuple[list[str], int]:
        calls: list[str] = []
        running = 0
        most = 0

        async def handle(key: str) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            calls.append(key)
            await asyncio.sleep(0.05)
            running -= 1

        queue: WorkQueue[str] = WorkQueue(handle, workers=4)
        queue.add("a")
        await asyncio.sleep(0.01)  # "a" is being handled now
        queue.add("a")  # changed meanwhile: must run once more afterwards
        queue.add("a")  # ... but only once
        queue.add("b")
        await asyncio.sleep(0.3)
        await queue.close()
        return calls, most

    calls, most = asyncio.run(scenario())
    assert sorted(calls) == ["a", "a", "b"]
    assert most == 2  # "a" and "b" ran side by side, "a" never with itself


def test_batched_events_fold_into_one_reconcile() -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []

        async def handle(key: str) -> None:
            calls.append(key)

        queue: WorkQueue[str] = WorkQueue(handle, workers=2)
        for _ in range(4):  # events spread over the window
            queue.add_batched("job", 0.1)
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        queue.add_batched("job", 0.1)
        await asyncio.sleep(0.2)
        await queue.close()
        return calls

    assert asyncio.run(scenario()) == ["job", "job"]


def test_a_failing_handler_does_not_stop_the_workers() -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []

        async def handle(key: str) -> None:
            calls.append(key)
            if key == "bad":
                raise RuntimeError("boom")

        queue: WorkQueue[str] = WorkQueue(handle, workers=1)
        queue.add("bad")
        queue.add("good")
        await asyncio.sleep(0.1)
        await queue.close()
        return calls

    assert asyncio.run(scenario()) == ["bad", "good"]
