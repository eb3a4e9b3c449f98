"""The relay's activity (SPEC WF-2): wake every link with work its workflow has not done;
the sweep is `services.relay_sweep`."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from protocol.relay import RelayPageInput, RelayPageResult
from services.relay_sweep import wake_page


class RelayActivities:
    """Bound to the worker's pool; Temporal calls go through the activity's own client."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn
    async def wake_links_with_pending_work(self, input: RelayPageInput) -> RelayPageResult:
        """Wake one page of links (key order after `input.after`) on this task queue."""
        client, task_queue = activity.client(), activity.info().task_queue
        return await wake_page(self._pool, client, task_queue, input)
