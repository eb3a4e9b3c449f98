"""A budget's request slots in Postgres (SPEC NF-8, migration 0150): one slot per interval
across every connection, a bounded catch-up after idle, nothing reserved beyond reach."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

import asyncpg
import pytest

from db.budget_pace import reserve_slot
from protocol.rate_limit import BUDGET_KEY_PREFIX, DISPATCH_AHEAD, PACE_TOLERANCE_S
from services import rate_limit


def _key() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


async def _reserve(
    pool: asyncpg.Pool, key: str, interval: float, tolerance: float = 0.0, cap: float = 60.0
) -> tuple[bool, float]:
    async with pool.acquire() as conn:
        answer = await reserve_slot(conn, key, interval, tolerance, cap)
    return answer.reserved, answer.wait_s


async def test_concurrent_reservations_take_distinct_slots_one_interval_apart(
    db_pool: asyncpg.Pool,
) -> None:
    key, interval = _key(), 0.5
    results = await asyncio.gather(*(_reserve(db_pool, key, interval) for _ in range(12)))

    assert all(reserved for reserved, _ in results)
    waits = sorted(wait for _, wait in results)
    assert waits[0] <= 0.05  # a fresh budget's first request goes at once
    gaps = [b - a for a, b in itertools.pairwise(waits)]
    # Each slot one interval after the previous (less the time between the statements).
    assert all(interval - 0.3 <= gap <= interval + 0.01 for gap in gaps), waits
    assert waits[-1] >= 11 * interval - 0.5


async def test_a_slot_beyond_reach_is_not_reserved(db_pool: asyncpg.Pool) -> None:
    key, interval = _key(), 1.0
    for _ in range(3):  # slots now, +1 s, +2 s
        assert (await _reserve(db_pool, key, interval, cap=2.5))[0]

    reserved, wait = await _reserve(db_pool, key, interval, cap=2.5)

    assert not reserved and wait == pytest.approx(3.0, abs=0.3)
    # Nothing was taken: the next caller with a longer reach gets that same slot.
    reserved, again = await _reserve(db_pool, key, interval, cap=10.0)
    assert reserved and again == pytest.approx(wait, abs=0.3)


async def test_an_idle_budget_catches_up_its_tolerance_and_no_more(db_pool: asyncpg.Pool) -> None:
    key, interval, tolerance = _key(), 0.5, 1.0
    async with db_pool.acquire() as conn:  # the budget was last used a minute ago
        await conn.execute(
            "INSERT INTO connector_budget_pace VALUES ($1, now() - interval '1 minute')", key
        )
    waits = [(await _reserve(db_pool, key, interval, tolerance))[1] for _ in range(5)]

    # 1 + tolerance / interval requests at once, then the pace again.
    assert [w <= 0 for w in waits] == [True, True, True, False, False], waits
    assert waits[4] - waits[3] == pytest.approx(interval, abs=0.1)


async def test_a_sender_that_wakes_past_its_slot_reserves_again_instead_of_bursting(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stalled process wakes every sender it held at once; sent then, they would land
    in the slots reserved after theirs, a burst the remote's window counts (CI saw 67 in
    a 10 s window of a 40 budget after a worker's SIGKILL on a loaded box). A sender
    that overslept its slot by more than the catch-up reserves the next one."""
    queue, key, interval = f"q-{_key()}", BUDGET_KEY_PREFIX + _key(), 0.5
    monkeypatch.setattr(rate_limit, "_paced_queues", {queue})
    weight = DISPATCH_AHEAD / (interval * rate_limit.FAIRNESS_DEFAULT_PER_SECOND)

    async def first_slot_in_one_second() -> float:
        async with db_pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO connector_budget_pace VALUES ($1, clock_timestamp() + interval '1 s')"
                " ON CONFLICT (budget_key) DO UPDATE SET next_free = excluded.next_free",
                key,
            )
            return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))

    async def next_free() -> float:
        async with db_pool.acquire() as conn:
            return float(
                await conn.fetchval(
                    "SELECT extract(epoch FROM next_free) FROM connector_budget_pace"
                    " WHERE budget_key = $1",
                    key,
                )
            )

    # Undisturbed: one slot, one second off, taken; the budget moves one interval.
    started = await first_slot_in_one_second()
    assert await rate_limit.reserve_pace(db_pool, queue, key, weight) is None
    assert await next_free() - started == pytest.approx(1.0 + interval, abs=0.2)
    assert "a slot missed" not in caplog.text

    # The process stalls 2.5 s while the sender waits for the same slot: it wakes ~1.7 s
    # late, past the 1 s catch-up, and takes a new slot (now less the catch-up).
    started = await first_slot_in_one_second()
    asyncio.get_running_loop().call_later(0.2, time.sleep, 2.5)
    assert await rate_limit.reserve_pace(db_pool, queue, key, weight) is None
    assert await next_free() - started >= 2.7 - PACE_TOLERANCE_S + interval - 0.1
    assert "a slot missed" in caplog.text
