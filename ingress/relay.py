"""The relay (SPEC ING-6): starts workflows for committed rows whose start never happened.

A row is relayed once it is `min_age` old, so the request's own background
start normally wins; when both run, the start's id policies make the second a
no-op. Any number of ingress processes may relay at once for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Final

import asyncpg

from db.bounded import bounded_transaction
from db.ingress_queries import unstarted_events, unstarted_executions
from ingress.dispatch import WorkflowStarter
from services.logthrottle import ThrottledLog

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

RELAY_INTERVAL_S: Final = 5.0
RELAY_MIN_AGE: Final = timedelta(seconds=10)
RELAY_BATCH: Final = 100
RELAY_QUERY_TIMEOUT_S: Final = 5.0


class Relay:
    def __init__(
        self,
        starter: WorkflowStarter,
        min_age: timedelta = RELAY_MIN_AGE,
        batch: int = RELAY_BATCH,
    ) -> None:
        self._starter = starter
        self._min_age = min_age
        self._batch = batch

    async def run_once(self, pool: asyncpg.Pool) -> int:
        """One pass over both backlogs; returns how many workflows it started. With workflow
        actions disabled (ING-7) the executions' backlog is not read: its rows stay as
        they are until the mode is switched on."""
        async with asyncio.timeout(RELAY_QUERY_TIMEOUT_S), bounded_transaction(pool) as conn:
            events = await unstarted_events(conn, self._min_age, self._batch)
            executions = (
                await unstarted_executions(conn, self._min_age, self._batch)
                if self._starter.actions_enabled
                else []
            )
        started = await self._starter.start_events(pool, events)
        for execution in executions:
            started += await self._starter.start_execution(pool, execution)
        return started

    async def run(self, pool: asyncpg.Pool, interval_s: float = RELAY_INTERVAL_S) -> None:
        """Relay until cancelled; a failed pass (database or Temporal down) is retried."""
        while True:
            try:
                if started := await self.run_once(pool):
                    log.info("relay started %d workflow(s)", started)
            except Exception as exc:
                warn.warning("relay pass failed: %s", type(exc).__name__)
            await asyncio.sleep(interval_s)
