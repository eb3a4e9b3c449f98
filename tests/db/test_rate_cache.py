"""PROF-3 / P2: the CRM entry's budget-rate cache is re-read after a pack change, and
beside a listener only then (no periodic transaction per process)."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
import yaml

from services import rate_limit
from services.packs import apply_pack
from services.rate_limit import _cached_rates, pack_change_listener, warm_budget_rates
from tests.e2e.support import eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def manifest_with_limit(requests: int) -> dict[str, object]:
    manifest: dict[str, object] = yaml.safe_load((EXAMPLES / "demo-pack.yaml").read_text())
    for profile in manifest["profiles"]:  # type: ignore[attr-defined]
        profile.pop("rateLimit", None)
    manifest["profiles"][0]["rateLimit"] = {"requests": requests, "perSeconds": 10}  # type: ignore[index]
    return manifest


async def apply(pool: asyncpg.Pool, requests: int) -> None:
    async with pool.acquire() as conn:
        await apply_pack(conn, manifest_with_limit(requests))


async def test_a_pack_change_reaches_a_listening_cache_without_waiting_for_the_interval(
    db_pool: asyncpg.Pool,
) -> None:
    await apply(db_pool, 100)
    async with pack_change_listener(db_pool):
        await warm_budget_rates(db_pool)
        before = dict(await _cached_rates(db_pool))
        await apply(db_pool, 300)

        # RATES_TTL_S is 10 s: only the notification can make this true sooner.
        after = await eventually(
            lambda: _cached_rates(db_pool), lambda rates: rates != before, timeout_s=5.0
        )
    assert max(after.values()) > max(before.values())


async def test_a_listening_cache_is_not_re_read_on_a_timer(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    await apply(db_pool, 100)
    monkeypatch.setattr(rate_limit, "RATES_TTL_S", 0.0)  # every unlistened read is stale
    async with pack_change_listener(db_pool):
        await warm_budget_rates(db_pool)
        cached = dict(await _cached_rates(db_pool))
        # A change that notifies nobody (triggers off for this session): a cache that
        # re-read on a timer would see it; the listening cache keeps what it read.
        async with db_pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute("UPDATE pack_install SET active = false WHERE active")
        assert await _cached_rates(db_pool) == cached
    # Without the listener the same cache falls back to the timed re-read.
    assert await _cached_rates(db_pool) == {}
