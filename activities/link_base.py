"""What the LinkWorkflow's activity classes share: the pool, the HTTP client, traced
transactions and the durable view each step returns."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import asyncpg
import httpx
from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.hooks import DispatchHooks
from db import links as q
from db.records import Conn
from protocol.daily_quota import wait_seconds, waiting_detail
from protocol.errors import ActivityErrorType as E
from protocol.messages import LinkView, StepKind, StepResult
from services import daily_quota
from services.daily_quota import QuotaWait
from services.rows import view_of

# Writes a try's checkpoint and journal row under its claim; None: another claim owns it.
Checkpoint = Callable[[Conn], Awaitable[int | None]]

_tracer = trace.get_tracer(__name__)
log = logging.getLogger(__name__)


def fail(kind: E, message: str, view: LinkView) -> ApplicationError:
    """A non-retryable error carrying the durable view the workflow publishes (§5.4)."""
    return ApplicationError(
        message, view.model_dump(mode="json"), type=kind.value, non_retryable=True
    )


class QuotaExhausted(Exception):
    """Raised inside a claim's transaction to roll it back: the budget's day is spent."""

    def __init__(self, wait: QuotaWait) -> None:
        super().__init__(wait.resets_at.isoformat())
        self.wait = wait


class LinkActivityBase:
    """Bound to the worker's pool and HTTP client (and the test seams)."""

    def __init__(
        self, pool: asyncpg.Pool, http: httpx.AsyncClient, hooks: DispatchHooks | None = None
    ) -> None:
        self._pool = pool
        self._http = http
        self._hooks = hooks or DispatchHooks()

    async def _fenced(
        self, key: str, journal_id: int | None, checkpoint: Checkpoint, lost: str
    ) -> int:
        """REC-1: this try's journal row, writing the checkpoint first unless the claim
        already wrote it; another claim owning the row (this try outlived its timeout)
        is a non-retryable conflict, `lost` its message: nothing is sent."""
        if journal_id is not None:
            return journal_id
        async with self._pool.acquire() as conn:
            journal_id = await checkpoint(conn)
            if journal_id is None:
                raise fail(E.TRANSITION_CONFLICT, lost, await self._view(conn, key))
        return journal_id

    async def _spend(self, conn: Conn, remote_scope: str, credential_ref: str) -> None:
        """Spend one request of the budget's daily quota in `conn`'s transaction (the one
        that claims the send), or raise `QuotaExhausted` to roll the claim back."""
        now = self._hooks.now()
        wait = await daily_quota.spend_or_wait(self._pool, conn, remote_scope, credential_ref, now)
        if wait is not None:
            raise QuotaExhausted(wait)

    async def _quota_wait(self, key: str, wait: QuotaWait) -> StepResult:
        """The link waits for its budget's daily quota (issue 33 item 3): not parked, not
        failed; the workflow sleeps until the reset (a durable timer) and looks again."""
        async with self._pool.acquire() as conn:
            view = await self._view(conn, key)
        detail = waiting_detail(wait.resets_at)
        log.info(detail, extra={"link_key": key})
        return StepResult(
            kind=StepKind.RETRY_LATER,
            view=view.model_copy(update={"quota_wait_until": wait.resets_at}),
            detail=detail,
            retry_after_seconds=wait_seconds(
                self._hooks.now(), wait.resets_at, self._hooks.quota_recheck_s
            ),
        )

    @asynccontextmanager
    async def _tx(self, key: str) -> AsyncIterator[Conn]:
        """One Postgres transaction of this activity, traced with the link key (NF-1)."""
        name = activity.info().activity_type if activity.in_activity() else "transaction"
        with _tracer.start_as_current_span(f"postgres {name}", attributes={"link_key": key}):
            async with self._pool.acquire() as conn, conn.transaction():
                yield conn

    async def _settled(self, conn: Conn, key: str) -> StepResult:
        view = await self._view(conn, key)
        if view.needs_operator:
            return StepResult(kind=StepKind.PARKED, view=view)
        if view.link_status is None:
            return StepResult(kind=StepKind.IDLE, view=view)
        # LANE-2: a link finalized outside the create path (reconcile, backfill) wakes the
        # deferred creates waiting on it here, at its workflow's next step, rather than at
        # their periodic re-check. Wakes nobody once they have left the deferred lane.
        dependants = await self._dependants(conn, view)
        return StepResult(kind=StepKind.FINALIZED, view=view, dependants=dependants)

    @staticmethod
    async def _dependants(conn: Conn, view: LinkView) -> list[str]:
        """Deferred creates waiting on this newly finalized link (LANE-2)."""
        if view.connector_owner_key is None or view.source_record_id is None:
            return []
        return await q.deferred_dependants(conn, view.connector_owner_key, view.source_record_id)

    @staticmethod
    async def _view(conn: Conn, key: str) -> LinkView:
        return view_of(key, await q.view_rows(conn, key))
