"""Every worker folds the links' per-state count deltas (migration 0160) while it runs,
so `status` and the gauges read a few rows per state however many links change state.
Two workers folding at once is safe (the fold's own comment says why)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Final

import asyncpg

from db.status import fold_link_state_counts
from worker import periodic

FOLD_EVERY: Final = timedelta(seconds=30)
log = logging.getLogger(__name__)


async def fold_counts(
    pool: asyncpg.Pool, stop: asyncio.Event, every: timedelta = FOLD_EVERY
) -> None:
    """Until `stop`: fold, then wait; a failed fold is tried again next time (the deltas
    stay exact, only more rows to sum)."""
    await periodic.every(
        pool, stop, every, fold_link_state_counts, log, "link state counts not folded"
    )
