"""Remote budgets in activities (SPEC PROF-3, NF-8): the remote-budget local activity
(which fairness key and weight a link's remote activities carry), and the slot every
remote activity waits for before it sends; the rates and the slots are
`services.rate_limit`."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from db import links as q
from protocol.messages import StepKind, StepResult
from protocol.rate_limit import RemoteBudgetInput, RemoteBudgetResult
from services import rate_limit
from services.rows import view_of


class RateLimitActivities:
    """Resolves which budget a link spends; runs as a local activity (Postgres only)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn
    async def remote_budget(self, input: RemoteBudgetInput) -> RemoteBudgetResult:
        """The link's fairness key when its budget is limited; no key otherwise."""
        async with self._pool.acquire() as conn:
            return await rate_limit.remote_budget(conn, input.link_key)


async def paced(pool: asyncpg.Pool, key: str) -> StepResult | None:
    """Wait for this remote activity's slot of its budget (from the fairness key and
    weight it was scheduled with), then None: go on and send. When the slot is further
    off than an activity may wait, nothing is sent or reserved: the link's workflow
    waits that long in a timer and runs the step again (RETRY_LATER, no retry spent)."""
    info = activity.info()
    priority = info.priority
    later = await rate_limit.reserve_pace(
        pool, info.task_queue, priority.fairness_key, priority.fairness_weight
    )
    if later is None:
        return None
    async with pool.acquire() as conn:
        view = view_of(key, await q.view_rows(conn, key))
    detail = f"remote budget paced: its next request slot is {later:.0f} s away"
    kind = StepKind.RETRY_LATER
    return StepResult(kind=kind, view=view, detail=detail, retry_after_seconds=later)
