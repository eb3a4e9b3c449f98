"""The remote-budget local activity (SPEC PROF-3, NF-8): which fairness key and weight a
link's remote activities carry. The slot each of them waits for before it sends is
`services.pacing`; the rates and the slots are `services.rate_limit`."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from protocol.rate_limit import RemoteBudgetInput, RemoteBudgetResult
from services import rate_limit


class RateLimitActivities:
    """Resolves which budget a link spends; runs as a local activity (Postgres only)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn
    async def remote_budget(self, input: RemoteBudgetInput) -> RemoteBudgetResult:
        """The link's fairness key when its budget is limited; no key otherwise."""
        async with self._pool.acquire() as conn:
            return await rate_limit.remote_budget(conn, input.link_key)
