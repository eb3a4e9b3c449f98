"""What a LinkWorkflow step runs with, and what the create path (`services.create`) and
the PATCH path (`services.patch`) share: the traced transaction, the durable view a
step ends with, the daily quota a send spends under its claim, the fence before a
send, and the two ways a step fails (SPEC §5.4), which the activity maps to Temporal's."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

import asyncpg
import httpx
from opentelemetry import trace

from db import links as q
from db.records import Conn
from protocol.daily_quota import wait_seconds, waiting_detail
from protocol.errors import ActivityErrorType
from protocol.manifest import DailyReset
from protocol.messages import LinkView, StepKind, StepResult
from protocol.rate_limit import INTERACTIVE_PRIORITY
from services import daily_quota
from services.daily_quota import QuotaWait
from services.dispatch_hooks import DispatchHooks
from services.landing import with_landing
from services.rows import view_of
from services.send_window import SendTurn

# Writes a try's checkpoint and journal row under its claim; None: another claim owns it.
Checkpoint = Callable[[Conn], Awaitable[int | None]]

_tracer = trace.get_tracer(__name__)
log = logging.getLogger(__name__)


def _no_heartbeat() -> None:
    """Outside an activity nobody watches for a heartbeat."""


@dataclass(frozen=True)
class LinkStep:
    """One step of a link's workflow: the worker's pool and HTTP client, the test seams,
    the step's name (its Postgres spans carry it, NF-1), its heartbeat, and when its
    activity's start-to-close ends (`loop.time()`; None outside an activity): each request
    passes it to `services.remote.send` as its deadline (G-7), with its `turn` (NF-8')."""

    pool: asyncpg.Pool
    http: httpx.AsyncClient
    hooks: DispatchHooks = field(default_factory=DispatchHooks)
    name: str = "transaction"
    heartbeat: Callable[[], None] = _no_heartbeat
    deadline: float | None = None
    rank: int = INTERACTIVE_PRIORITY  # its activity's Temporal priority (bulk after single)

    def turn(self, remote_scope: str) -> SendTurn:
        """Where this step's request to `remote_scope` takes its send window turn (NF-8')."""
        return SendTurn(self.pool, remote_scope, self.rank)

    @asynccontextmanager
    async def tx(self, key: str) -> AsyncIterator[Conn]:
        """One Postgres transaction of this step, traced with the link key (NF-1)."""
        with _tracer.start_as_current_span(f"postgres {self.name}", attributes={"link_key": key}):
            async with self.pool.acquire() as conn, conn.transaction():
                yield conn


class StepFailed(Exception):
    """A non-retryable failure (SPEC §5.4), with the durable view the workflow publishes
    (None where there is no link to show); the activity raises it as Temporal's."""

    def __init__(self, kind: ActivityErrorType, message: str, view: LinkView | None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.view = view


class RetryKind(StrEnum):
    """Why Temporal runs the step again, once this try's outcome is durable."""

    RETRY = "Retry"  # the same frozen request goes again (replay-safe, or not applied)
    RATE_LIMITED = "RateLimited"
    LOCATOR_RECOVERY = "LocatorRecovery"  # the next try looks the unique locator up
    PATCH_RETRY = "PatchRetry"
    MIRROR_CONFLICT = "MirrorConflict"  # the mirror's compare-and-set lost; mirror only


class StepRetry(Exception):
    """A retryable failure: the activity's retry policy runs the step again, after
    `delay` when the remote named one."""

    def __init__(self, kind: RetryKind, message: str, delay: timedelta | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.delay = delay


async def view(conn: Conn, key: str) -> LinkView:
    """The link's durable view, as the workflow publishes it (with a parked ambiguous
    attempt's journal verdict, G-6)."""
    return await with_landing(conn, view_of(key, await q.view_rows(conn, key)))


async def settled(conn: Conn, key: str) -> StepResult:
    """What the link is once a step has nothing (more) to send."""
    now = await view(conn, key)
    if now.needs_operator:
        return StepResult(kind=StepKind.PARKED, view=now)
    if now.link_status is None:
        return StepResult(kind=StepKind.IDLE, view=now)
    # LANE-2: a link finalized outside the create path (reconcile, backfill) wakes the
    # deferred creates waiting on it here, at its workflow's next step, rather than at
    # their periodic re-check. Wakes nobody once they have left the deferred lane.
    return StepResult(kind=StepKind.FINALIZED, view=now, dependants=await dependants(conn, now))


async def dependants(conn: Conn, now: LinkView) -> list[str]:
    """Deferred creates waiting on this newly finalized link (LANE-2)."""
    if now.connector_owner_key is None or now.source_record_id is None:
        return []
    return await q.deferred_dependants(conn, now.connector_owner_key, now.source_record_id)


async def lock_link(conn: Conn, key: str) -> None:
    """The link key's lock, which admission takes too, for the rest of the transaction."""
    await q.lock_link_key(conn, key)


class QuotaExhausted(Exception):
    """Raised inside a claim's transaction to roll it back: the budget's day is spent."""

    def __init__(self, wait: QuotaWait) -> None:
        super().__init__(wait.resets_at.isoformat())
        self.wait = wait


async def spend(step: LinkStep, conn: Conn, remote_scope: str, credential_ref: str) -> None:
    """Spend one request of the budget's daily quota in `conn`'s transaction (the one
    that claims the send), or raise `QuotaExhausted` to roll the claim back."""
    now = step.hooks.now()
    wait = await daily_quota.spend_or_wait(step.pool, conn, remote_scope, credential_ref, now)
    if wait is not None:
        raise QuotaExhausted(wait)


async def refuse_day(
    step: LinkStep, conn: Conn, remote_scope: str, credential_ref: str, reset: DailyReset
) -> QuotaWait:
    """The remote answered its declared daily limit (PROF-5): the whole budget waits until
    the frozen contract's `reset`."""
    now = step.hooks.now()
    return await daily_quota.refuse_day(step.pool, conn, remote_scope, credential_ref, now, reset)


async def quota_wait(step: LinkStep, key: str, wait: QuotaWait) -> StepResult:
    """The link waits for its budget's daily quota (NF-8): not parked, not
    failed; the workflow sleeps until the reset (a durable timer) and looks again."""
    async with step.pool.acquire() as conn:
        now = await view(conn, key)
    detail = waiting_detail(wait.resets_at)
    log.info(detail, extra={"link_key": key})
    return StepResult(
        kind=StepKind.RETRY_LATER,
        view=now.model_copy(update={"quota_wait_until": wait.resets_at}),
        detail=detail,
        retry_after_seconds=wait_seconds(
            step.hooks.now(), wait.resets_at, step.hooks.quota_recheck_s
        ),
    )


async def fenced(
    step: LinkStep, key: str, journal_id: int | None, checkpoint: Checkpoint, lost: str
) -> int:
    """REC-1: this try's journal row, writing the checkpoint first unless the claim
    already wrote it; another claim owning the row (this try outlived its timeout) is a
    non-retryable conflict, `lost` its message: nothing is sent."""
    if journal_id is not None:
        return journal_id
    async with step.pool.acquire() as conn:
        journal_id = await checkpoint(conn)
        if journal_id is None:
            raise StepFailed(ActivityErrorType.TRANSITION_CONFLICT, lost, await view(conn, key))
    return journal_id
