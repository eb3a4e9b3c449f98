"""The scheduled prune (SPEC OPS-3) as an activity; the deleting is `services.retention`."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
from temporalio import activity

from protocol.retention import PruneInput, PruneReport
from services.retention import prune


class RetentionActivities:
    """The scheduled prune (worker/schedules.py), on the worker's pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn
    async def prune_finished(self, request: PruneInput) -> PruneReport:
        """Idempotent: a retry deletes whatever is still finished and old; rows G-3 keeps
        are skipped, never an error."""
        async with self._pool.acquire() as conn:
            return await prune(conn, request, datetime.now(UTC))
