"""The worker's housekeeping loops (status gauges, link state folds): one step on a
pooled connection every interval until `stop`, a failed step logged and tried again at
the next interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

import asyncpg

from db.records import Conn


async def every(
    pool: asyncpg.Pool,
    stop: asyncio.Event,
    interval: timedelta,
    step: Callable[[Conn], Awaitable[None]],
    log: logging.Logger,
    failed: str,
) -> None:
    """Until `stop`: run `step` on a connection of `pool`, then wait `interval`; Postgres
    unreachable or refusing logs `failed` with the error's type (never its message)."""
    while not stop.is_set():
        try:
            async with pool.acquire() as conn:
                await step(conn)
        except (OSError, asyncpg.PostgresError) as error:
            log.warning("%s: %s", failed, type(error).__name__)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval.total_seconds())
