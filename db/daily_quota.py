"""Named queries for daily quotas (NF-8): one row per budget and day.

`spend` is the one statement a request costs: it adds one unit under the row's lock only
while a unit is left, so workers racing for the last unit get it once (READ COMMITTED
re-evaluates the ON CONFLICT condition on the newest version of the row).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Final

from asyncpg import Record

from db.records import Conn

SPEND: Final = """
INSERT INTO connector_daily_quota AS q (budget_key, quota_day, spent, allowance, resets_at)
VALUES ($1, $2, 1, $3, $4)
ON CONFLICT (budget_key, quota_day) DO UPDATE
SET spent = q.spent + 1, allowance = EXCLUDED.allowance, resets_at = EXCLUDED.resets_at,
    updated_at = now()
WHERE q.spent < EXCLUDED.allowance AND q.refused_at IS NULL
RETURNING spent
"""

REFUSE: Final = """
INSERT INTO connector_daily_quota AS q (budget_key, quota_day, allowance, resets_at, refused_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (budget_key, quota_day) DO UPDATE
SET refused_at = coalesce(q.refused_at, EXCLUDED.refused_at), updated_at = now()
"""

CURRENT: Final = """
SELECT budget_key, quota_day, spent, allowance, resets_at, refused_at
FROM connector_daily_quota WHERE resets_at > $1 ORDER BY budget_key, quota_day
"""

REFUSED: Final = """
SELECT budget_key, quota_day, spent, allowance, resets_at, refused_at
FROM connector_daily_quota WHERE resets_at > $1 AND refused_at IS NOT NULL
"""

WAITING: Final = """
SELECT budget_key, quota_day, spent, allowance, resets_at, refused_at
FROM connector_daily_quota
WHERE budget_key = $1 AND resets_at > $2 AND (spent >= allowance OR refused_at IS NOT NULL)
ORDER BY resets_at DESC LIMIT 1
"""


# The budget a link's pending work spends: its newest attempt's frozen scope and credential,
# when that attempt or a PATCH of the link still waits to be sent.
LINK_PENDING_BUDGET: Final = """
SELECT f.request_snapshot->>'remote_scope' AS remote_scope,
       f.request_snapshot->'profile'->>'credential_ref' AS credential_ref
FROM connector_push_attempt a JOIN connector_push_attempt_frozen f USING (attempt_id)
WHERE a.link_key = $1
  AND (a.status IN ('pending', 'processing')
       OR EXISTS (SELECT 1 FROM connector_patch_dispatch p
                  WHERE p.link_key = $1 AND p.status IN ('pending', 'processing')))
ORDER BY a.attempt_ordinal DESC LIMIT 1
"""


@dataclass(frozen=True)
class QuotaDayRow:
    budget_key: str
    quota_day: date
    spent: int
    allowance: int | None  # None: no quota declared (a row the remote's daily 429 wrote)
    resets_at: datetime
    refused_at: datetime | None


async def spend(conn: Conn, key: str, day: date, allowance: int, resets_at: datetime) -> int | None:
    """Spend one unit of `key`'s day; the units spent after it, or None when none was left
    (or the remote refused the day)."""
    spent: int | None = await conn.fetchval(SPEND, key, day, allowance, resets_at)
    return spent


async def refuse(
    conn: Conn,
    key: str,
    day: date,
    allowance: int | None,
    resets_at: datetime,
    now: datetime,
) -> None:
    """The remote refused `key`'s day (a 429 naming its daily policy): nothing more is sent
    under it until `resets_at`."""
    await conn.execute(REFUSE, key, day, allowance, resets_at, now)


def _row(r: Record) -> QuotaDayRow:
    return QuotaDayRow(
        r["budget_key"], r["quota_day"], r["spent"], r["allowance"], r["resets_at"], r["refused_at"]
    )


async def current_days(conn: Conn, now: datetime) -> list[QuotaDayRow]:
    """Every budget's days that have not reset by `now`."""
    return [_row(r) for r in await conn.fetch(CURRENT, now)]


async def refused_days(conn: Conn, now: datetime) -> list[QuotaDayRow]:
    """Every budget's day the remote refused that has not reset by `now`."""
    return [_row(r) for r in await conn.fetch(REFUSED, now)]


async def waiting_day(conn: Conn, key: str, now: datetime) -> QuotaDayRow | None:
    """`key`'s spent or refused day that has not reset by `now`, if any."""
    record = await conn.fetchrow(WAITING, key, now)
    return None if record is None else _row(record)


async def link_pending_budget(conn: Conn, link_key: str) -> tuple[str, str] | None:
    """(remote scope, credential reference) of the link's unsent work, if it has any."""
    row = await conn.fetchrow(LINK_PENDING_BUDGET, link_key)
    if row is None or row["remote_scope"] is None or row["credential_ref"] is None:
        return None
    return row["remote_scope"], row["credential_ref"]
