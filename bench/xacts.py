"""Committed Postgres transactions of the bench database (P2, and floor_io's count),
read from another database so the reading itself is not counted."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from bench.stack import DATABASE

# An idle backend's pending counters reach pg_stat_database within PGSTAT_IDLE_INTERVAL
# (10 s) of its last transaction, or at once when it exits.
IDLE_FLUSH_S = 11.0


async def xact_commits(stats: asyncpg.Connection) -> int:
    """The bench database's committed transactions (each autocommit statement on `stats`,
    connected to another database, reads fresh stats)."""
    value = await stats.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", DATABASE
    )
    return int(value)


async def settled(stats: asyncpg.Connection, hold_s: float = 1.2) -> int:
    """A reading of the counters that has held still for `hold_s`."""
    last, since = await xact_commits(stats), time.monotonic()
    while time.monotonic() - since < hold_s:
        await asyncio.sleep(0.2)  # poll interval; the unchanged reading is the condition
        now = await xact_commits(stats)
        if now != last:
            last, since = now, time.monotonic()
    return last
