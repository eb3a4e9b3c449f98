"""The in-process line before a budget's send window (NF-8, NF-8'): one asker at a time,
and a single save's request ahead of its tenant's bulk `push` requests already waiting."""

from __future__ import annotations

import asyncio

import pytest

from protocol.rate_limit import BULK_PRIORITY, INTERACTIVE_PRIORITY
from services.send_window import Line


async def _queue(line: Line, rank: int, name: str, order: list[str]) -> None:
    await line.acquire(rank)
    order.append(name)
    line.release()


async def _until_waiting(line: Line, count: int) -> None:
    async with asyncio.timeout(5):
        while line.waiting < count:
            await asyncio.sleep(0)


async def test_a_single_save_is_served_before_bulk_requests_that_waited_longer() -> None:
    """NF-8: with FIFO (asyncio.Lock) the single save would be served last."""
    line = Line()
    await line.acquire(BULK_PRIORITY)  # a bulk request holds the line (asking Postgres)
    order: list[str] = []
    bulk = [asyncio.create_task(_queue(line, BULK_PRIORITY, f"bulk-{i}", order)) for i in range(3)]
    await _until_waiting(line, 3)
    single = asyncio.create_task(_queue(line, INTERACTIVE_PRIORITY, "single", order))
    await _until_waiting(line, 4)
    line.release()
    await asyncio.gather(single, *bulk)
    assert order == ["single", "bulk-0", "bulk-1", "bulk-2"]


async def test_a_waiter_that_times_out_leaves_the_line_to_the_next() -> None:
    line = Line()
    await line.acquire(BULK_PRIORITY)
    order: list[str] = []
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await line.acquire(INTERACTIVE_PRIORITY)
    assert line.waiting == 0
    late = asyncio.create_task(_queue(line, BULK_PRIORITY, "late", order))
    await _until_waiting(line, 1)
    line.release()
    async with asyncio.timeout(5):
        await late
    assert order == ["late"]
    await _queue(line, BULK_PRIORITY, "free again", order)  # released, not held forever


async def test_a_waiter_cancelled_after_it_was_handed_the_line_hands_it_on() -> None:
    line = Line()
    await line.acquire(BULK_PRIORITY)
    first = asyncio.create_task(line.acquire(INTERACTIVE_PRIORITY))
    order: list[str] = []
    second = asyncio.create_task(_queue(line, BULK_PRIORITY, "second", order))
    await _until_waiting(line, 2)
    line.release()  # handed to `first`, which is cancelled before it resumes
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(5):
        await second
    assert order == ["second"]


async def test_a_waiter_cancelled_while_a_release_drops_it_raises_only_its_cancellation() -> None:
    """The release runs between the cancellation and the waiter's resumption: it drops the
    cancelled place and hands the line on; the waiter must not fail removing it again."""
    line = Line()
    await line.acquire(BULK_PRIORITY)
    first = asyncio.create_task(line.acquire(INTERACTIVE_PRIORITY))
    order: list[str] = []
    second = asyncio.create_task(_queue(line, BULK_PRIORITY, "second", order))
    await _until_waiting(line, 2)
    first.cancel()  # its place is cancelled now; the task resumes later
    line.release()  # drops the cancelled place, hands the line to `second`
    with pytest.raises(asyncio.CancelledError):
        await first
    async with asyncio.timeout(5):
        await second
    assert order == ["second"]
