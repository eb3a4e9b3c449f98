"""Daily quotas in Postgres (issue 33 item 3, SPEC NF-8): the counter never lets two
workers both spend the last unit, a refused day spends nothing, and `status` shows it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
import yaml
from rich.console import Console

from cli.status_cmd import render
from db import daily_quota as q
from db.records import Conn
from protocol.daily_quota import next_reset, quota_day
from protocol.manifest import DailyReset
from protocol.status import gauges
from services.daily_quota import QuotaWait, forget_quotas, refuse_day, spend_or_wait
from services.packs import apply_pack
from services.status import read_status
from tests.e2e.support import eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KEY = "rb1_test-budget"
NOW = datetime.now(UTC)
DAY = quota_day(NOW, "UTC")
UTC_DAY = DailyReset(time_zone="UTC")  # PROF-5: the refusal's declared reset
RESETS = next_reset(NOW, "UTC")


@pytest.fixture
async def remote_scope_pack(db_pool: asyncpg.Pool) -> AsyncIterator[None]:
    """The demo pack, which declares no daily quota."""
    manifest = yaml.safe_load((EXAMPLES / "demo-pack.yaml").read_text())
    async with db_pool.acquire() as conn:
        await apply_pack(conn, manifest)
    forget_quotas()
    yield
    forget_quotas()


async def _spend(conn: Conn, allowance: int) -> int | None:
    return await q.spend(conn, KEY, DAY, allowance, RESETS)


async def _waits_for_a_lock(pool: asyncpg.Pool, pid: int) -> bool:
    event = await pool.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid)
    return bool(event == "Lock")


async def test_two_connections_racing_for_the_last_unit_get_it_once(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as first, db_pool.acquire() as second:
        assert [await _spend(first, 2)] == [1]
        tx = first.transaction()
        await tx.start()
        assert await _spend(first, 2) == 2  # the last unit, not committed yet
        # The second worker's spend waits on the row's lock, then finds nothing left.
        racing = asyncio.create_task(_spend(second, 2))
        await eventually(lambda: _waits_for_a_lock(db_pool, second.get_server_pid()), bool, 5.0)
        await tx.commit()
        assert await asyncio.wait_for(racing, 5.0) is None

        # A claim that rolls back returns its unit: the waiting spender gets it instead.
        tx = first.transaction()
        await tx.start()
        assert await _spend(first, 3) == 3
        racing = asyncio.create_task(_spend(second, 3))
        await eventually(lambda: _waits_for_a_lock(db_pool, second.get_server_pid()), bool, 5.0)
        await tx.rollback()
        assert await asyncio.wait_for(racing, 5.0) == 3


async def test_many_spenders_at_once_spend_exactly_the_allowance(db_pool: asyncpg.Pool) -> None:
    async def one() -> int | None:
        async with db_pool.acquire() as conn:
            return await _spend(conn, 5)

    results = await asyncio.gather(*(one() for _ in range(12)))

    assert sorted(r for r in results if r is not None) == [1, 2, 3, 4, 5]
    assert await db_pool.fetchval("SELECT spent FROM connector_daily_quota") == 5


async def test_a_day_the_remote_refused_spends_nothing_and_status_says_until_when(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        assert await _spend(conn, 100) == 1
        await q.refuse(conn, KEY, DAY, 100, RESETS, NOW)
        assert await _spend(conn, 100) is None
        # The next day starts afresh.
        tomorrow = quota_day(RESETS, "UTC")
        assert await q.spend(conn, KEY, tomorrow, 100, RESETS + timedelta(days=1)) == 1

        status = await read_status(conn, NOW)
        later = await read_status(conn, RESETS + timedelta(seconds=1))

    today = next(d for d in status.daily_quotas if d.day == DAY)
    assert (today.spent, today.allowance, today.resets_at) == (1, 100, RESETS)
    assert today.refused_by_remote and today.waiting
    assert [d.day for d in later.daily_quotas] == [tomorrow]  # the reset day is gone
    assert not later.daily_quotas[0].waiting
    published = {
        (name, value) for name, labels, value in gauges(status, NOW) if labels == {"budget": KEY}
    }
    assert {
        ("connector_push_status_daily_quota_spent", 1),
        ("connector_push_status_daily_quota_allowance", 100),
        ("connector_push_status_daily_quota_waiting", 1.0),
    } <= published
    console = Console(record=True, width=200)
    console.print(render(status))
    assert (
        f"daily quota {KEY}: 1 of 100 spent, waiting for the daily quota (the remote refused "
        f"the day) until {RESETS.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    ) in console.export_text()


async def test_a_budget_without_a_quota_pauses_when_the_remote_refuses_its_day(
    db_pool: asyncpg.Pool, remote_scope_pack: None
) -> None:
    scope, credential = "sandbox-portal", "env:SANDBOX_TOKEN"
    async with db_pool.acquire() as conn:
        assert await spend_or_wait(db_pool, conn, scope, credential, NOW) is None
        refused = await refuse_day(db_pool, conn, scope, credential, NOW, UTC_DAY)
        # This worker knows at once; another (an empty cache) reads it from Postgres.
        first = await spend_or_wait(db_pool, conn, scope, credential, NOW)
        forget_quotas()
        other = await spend_or_wait(db_pool, conn, scope, credential, NOW)
        after = await spend_or_wait(db_pool, conn, scope, credential, RESETS)
    assert refused.resets_at == RESETS
    assert first == other == QuotaWait(refused.budget_key, RESETS, refused=True)
    assert after is None
    # No quota declared: nothing counted, the refusal's row only.
    assert await db_pool.fetchval("SELECT sum(spent) FROM connector_daily_quota") == 0
