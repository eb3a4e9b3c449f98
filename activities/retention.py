"""The scheduled prune (SPEC OPS-3) as an activity; the deleting is `services.retention`,
its audit entry (G-8) `services.prune_audit`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

import asyncpg
from temporalio import activity

from protocol.retention import PruneInput, PruneReport
from services.prune_audit import audited_prune

# Who the audit trail names for a run the worker's schedule started (no person did).
SCHEDULED_OPERATOR: Final = "retention schedule"


class RetentionActivities:
    """The scheduled prune (worker/schedules.py), on the worker's pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn
    async def prune_finished(self, request: PruneInput) -> PruneReport:
        """Idempotent: a retry deletes whatever is still finished and old; rows G-3 keeps
        are skipped, never an error."""
        info = activity.info()
        why = f"scheduled prune (OPS-3): workflow {info.workflow_id}, attempt {info.attempt}"
        async with self._pool.acquire() as conn:
            return await audited_prune(conn, request, datetime.now(UTC), SCHEDULED_OPERATOR, why)
