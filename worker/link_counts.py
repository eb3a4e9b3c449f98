"""Every worker folds the links' per-state count deltas (migration 0160) while it runs,
so `status` and the gauges read a few rows per state however many links change state.
Two workers folding at once is safe (the fold's own comment says why)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Final

import asyncpg

from db.status import fold_link_state_counts

FOLD_EVERY: Final = timedelta(seconds=30)
log = logging.getLogger(__name__)


async def fold_counts(
    pool: asyncpg.Pool, stop: asyncio.Event, every: timedelta = FOLD_EVERY
) -> None:
    """Until `stop`: fold, then wait; a failed fold is logged and tried again next time
    (the deltas stay exact, only more rows to sum)."""
    while not stop.is_set():
        try:
            async with pool.acquire() as conn:
                await fold_link_state_counts(conn)
        except (OSError, asyncpg.PostgresError) as error:
            log.warning("link state counts not folded: %s", type(error).__name__)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every.total_seconds())
