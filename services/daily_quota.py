"""Daily quotas at the send (NF-8): spend one unit of the budget's day
per remote request, or say until when the budget waits.

The declared quotas come from the active packs (`protocol.daily_quota.budget_quotas`),
cached per database for `QUOTAS_TTL_S` (a changed quota applies within that); the count
is Postgres's, in the caller's transaction (`db.daily_quota.spend`), so it holds across
every worker process and a worker's death. A budget without a `dailyQuota` costs no
statement per request and keeps no count; a day the remote refuses (`refuse_day`)
pauses it all the same, known from the same cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import asyncpg

from db import daily_quota as q
from db.notify import database_key
from db.records import Conn
from protocol.daily_quota import (
    DailyQuota,
    budget_quotas,
    next_reset,
    quota_day,
    refusal_resets_at,
)
from protocol.manifest import DEFAULT_DAILY_RESET_TIME_ZONE, DailyReset
from protocol.rate_limit import budget_key
from services.packs import active_manifests

QUOTAS_TTL_S: Final = 10.0


@dataclass(frozen=True)
class QuotaWait:
    """The budget may send nothing more before `resets_at`."""

    budget_key: str
    resets_at: datetime
    refused: bool  # the remote answered a 429 naming its daily policy (else: share spent)


@dataclass
class _Known:
    """What a worker knows of the budgets, re-read every `QUOTAS_TTL_S`: the declared
    quotas, and the days the remote refused (by budget key, until their reset)."""

    expires: float
    quotas: dict[str, DailyQuota]
    refused: dict[str, datetime]


_known: dict[str, _Known] = {}  # per database


async def _budgets(pool: asyncpg.Pool, conn: Conn, now: datetime) -> _Known:
    cache_key = database_key(pool)
    known = _known.get(cache_key)
    if known is not None and time.monotonic() < known.expires:
        return known
    quotas = budget_quotas(await active_manifests(conn))
    refused = {d.budget_key: d.resets_at for d in await q.refused_days(conn, now)}
    known = _known[cache_key] = _Known(time.monotonic() + QUOTAS_TTL_S, quotas, refused)
    return known


def forget_quotas() -> None:
    """Drop every cached quota (a test that changes a pack's quota and must see it now)."""
    _known.clear()


async def spend_or_wait(
    pool: asyncpg.Pool, conn: Conn, remote_scope: str, credential_ref: str, now: datetime
) -> QuotaWait | None:
    """Spend one request of the budget's day in `conn`'s transaction (None: go on), or the
    wait when the day's share is spent or the remote refused the day. Nothing is written
    when it waits: a caller that rolls back its claim leaves no trace. A budget without a
    declared quota costs no statement: a day the remote refused is known from the cache
    (at once in this worker, within `QUOTAS_TTL_S` in the others)."""
    key = budget_key(remote_scope, credential_ref)
    known = await _budgets(pool, conn, now)
    quota = known.quotas.get(key)
    if quota is None:
        until = known.refused.get(key)
        return QuotaWait(key, until, refused=True) if until is not None and until > now else None
    resets_at = next_reset(now, quota.time_zone)
    day = quota_day(now, quota.time_zone)
    if await q.spend(conn, key, day, quota.allowance, resets_at) is not None:
        return None
    refused = await q.waiting_day(conn, key, now)
    return QuotaWait(key, resets_at, refused is not None and refused.refused_at is not None)


async def refuse_day(
    pool: asyncpg.Pool,
    conn: Conn,
    remote_scope: str,
    credential_ref: str,
    now: datetime,
    reset: DailyReset,
) -> QuotaWait:
    """The remote answered its declared daily limit (PROF-5): the whole budget waits until
    `reset` frees it (a calendar midnight, or a rolling window after the refusal); the
    refusal is recorded on the budget's counted day."""
    key = budget_key(remote_scope, credential_ref)
    known = await _budgets(pool, conn, now)
    quota = known.quotas.get(key)
    zone = quota.time_zone if quota else reset.time_zone or DEFAULT_DAILY_RESET_TIME_ZONE
    resets_at = refusal_resets_at(now, reset)
    allowance = quota.allowance if quota else None
    await q.refuse(conn, key, quota_day(now, zone), allowance, resets_at, now)
    known.refused[key] = resets_at  # this worker's next request waits at once
    return QuotaWait(key, resets_at, refused=True)


async def quota_days(conn: Conn, now: datetime) -> list[q.QuotaDayRow]:
    """Every budget's quota days not yet reset (for `status`)."""
    return await q.current_days(conn, now)


async def link_waiting_until(conn: Conn, link_key: str, now: datetime) -> datetime | None:
    """Until when the link's unsent work waits for its budget's daily quota (None: it does
    not), from Postgres alone (`links show`)."""
    budget = await q.link_pending_budget(conn, link_key)
    if budget is None:
        return None
    row = await q.waiting_day(conn, budget_key(*budget), now)
    return None if row is None else row.resets_at
