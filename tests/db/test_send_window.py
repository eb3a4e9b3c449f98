"""A budget's send window in Postgres (SPEC NF-8', migration 0330): whatever slots the
senders reserved and however late they woke for them, no span of the window holds more
than its limit of recorded sends, across concurrent connections."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Sequence

import asyncpg
import pytest

from db.budget_pace import reserve_slot, take_send_turn
from protocol.rate_limit import SendWindow, window_allows

LIMIT, SPAN_S = 5, 1.0  # 5 requests per 1 s (the span is W + margin: the remote's W less)
SENDERS = 30


def _key() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def pool(db_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """One connection per few senders: the statements really run side by side."""
    pool = await asyncpg.create_pool(db_dsn, min_size=10, max_size=10)
    try:
        yield pool
    finally:
        await pool.close()


def busiest(times: Sequence[float], span: float) -> int:
    """The most instants in any half-open span (t - span, t] (a strict limiter's count)."""
    ordered = sorted(times)
    return max(sum(1 for s in ordered if t - span < s <= t) for t in ordered)


async def _now(pool: asyncpg.Pool) -> float:
    async with pool.acquire() as conn:
        return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))


async def _send(pool: asyncpg.Pool, key: str) -> float:
    """Take a turn as `services.send_window` does: ask, wait what the refusal says, ask
    again; the instant Postgres recorded."""
    while True:
        async with pool.acquire() as conn:
            answer = await take_send_turn(conn, key, LIMIT, SPAN_S)
        if answer.sent_at is not None:
            return answer.sent_at
        await asyncio.sleep(max(answer.wait_s, 0.005))  # the window is the condition


async def test_concurrent_senders_never_put_more_than_the_limit_in_a_window(
    pool: asyncpg.Pool,
) -> None:
    key = _key()
    sent = await asyncio.gather(*(_send(pool, key) for _ in range(SENDERS)))

    assert len(sent) == len(set(sent)) == SENDERS
    assert busiest(sent, SPAN_S) == LIMIT  # full windows, never one more
    # A window's worth goes at once; the rest needs the window to move.
    assert max(sent) - min(sent) >= (SENDERS // LIMIT - 1) * SPAN_S


async def test_senders_late_for_their_slots_bunch_and_the_window_still_holds(
    pool: asyncpg.Pool,
) -> None:
    """The bunching that broke the slot rule (bench P6: 21 in a 10 s window of 20):
    senders reserve GCRA slots paced L per span (0150) and wake late for them by up to
    the old one-second tolerance, scaled to this window (a stalled loop wakes several at
    once). Sent at their wakes, windows exceed the limit; each taking its window turn
    first, none does."""
    key, rng = _key(), random.Random(51)
    interval = SPAN_S / LIMIT  # the slots alone would allow exactly LIMIT per span
    async with pool.acquire() as conn:  # 30 slots, one interval apart, all reserved now
        slots = [
            (await reserve_slot(conn, key, interval, 0.0, 60.0)).wait_s for _ in range(SENDERS)
        ]
    started = await _now(pool)
    # Late by up to two intervals, the late ones beside their punctual successors.
    late = [rng.choice((0.0, 0.0, 1.5 * interval, 2.0 * interval)) for _ in slots]

    async def sender(wait: float, lateness: float) -> tuple[float, float]:
        await asyncio.sleep(wait + lateness)  # the schedule under test: a slot, then late
        woke = await _now(pool)
        return woke, await _send(pool, key)

    results = await asyncio.gather(*(sender(w, x) for w, x in zip(slots, late, strict=True)))
    woke = [w for w, _ in results]
    sent = [s for _, s in results]

    assert busiest(woke, SPAN_S) > LIMIT  # sent at their wakes (the slot rule), too many
    assert busiest(sent, SPAN_S) <= LIMIT  # sent at their turns, never
    assert all(s >= w for w, s in results)
    assert min(woke) >= started - 0.05


async def test_a_full_window_refuses_and_says_when_it_frees(pool: asyncpg.Pool) -> None:
    key = _key()
    first = [await _send(pool, key) for _ in range(LIMIT)]
    async with pool.acquire() as conn:
        refused = await take_send_turn(conn, key, LIMIT, SPAN_S)
        ring = await conn.fetchval(
            "SELECT cardinality(sent) FROM connector_budget_pace WHERE budget_key = $1", key
        )

    assert refused.sent_at is None
    now = await _now(pool)
    assert refused.wait_s == pytest.approx(first[0] + SPAN_S - now, abs=0.3)
    assert ring == LIMIT  # a refusal records nothing
    # The pure rule agrees with the statement on the same instants.
    window = SendWindow(requests=LIMIT, span_s=SPAN_S)
    assert not window_allows(first, first[-1], window)
    assert window_allows(first, first[0] + SPAN_S, window)


async def test_the_window_keeps_only_the_last_limit_sends(pool: asyncpg.Pool) -> None:
    key = _key()
    async with pool.acquire() as conn:  # the budget's row as 0150 left it: no sends yet
        await conn.execute(
            "INSERT INTO connector_budget_pace (budget_key, next_free) VALUES ($1, now())", key
        )
        taken = [await take_send_turn(conn, key, 3, 0.001) for _ in range(7)]
        ring = await conn.fetchval(
            "SELECT sent FROM connector_budget_pace WHERE budget_key = $1", key
        )

    recorded = [t.sent_at for t in taken if t.sent_at is not None]
    assert len(recorded) >= 3
    assert [r.timestamp() for r in ring] == pytest.approx(recorded[-3:], abs=1e-6)
