"""A budget's request slots in Postgres (SPEC NF-8, migration 0150): one slot per interval
across every connection, a bounded catch-up after idle, nothing reserved beyond reach."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import asyncpg
import pytest

from db.budget_pace import reserve_slot


def _key() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


async def _reserve(
    pool: asyncpg.Pool, key: str, interval: float, tolerance: float = 0.0, cap: float = 60.0
) -> tuple[bool, float]:
    async with pool.acquire() as conn:
        return await reserve_slot(conn, key, interval, tolerance, cap)


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
