"""The relay's sweep (SPEC WF-2): wake every link with work its workflow has not done.

Idempotent by construction: waking is a signal-with-start whose signal only says
"look for work", and the workflow decides from Postgres, so a retried page or two
overlapping sweeps change nothing.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Final

import asyncpg
from temporalio.client import Client

from db import relay as q
from protocol.relay import RelayPageInput, RelayPageResult
from services.wake import link_facts, wake_link

# Signal-with-starts in flight at once: enough to sweep a backlog quickly without
# flooding the frontend.
WAKE_CONCURRENCY: Final = 16


async def wake_page(
    pool: asyncpg.Pool, client: Client, task_queue: str, page: RelayPageInput
) -> RelayPageResult:
    """Wake one page of links (key order after `page.after`) on `task_queue`."""
    async with pool.acquire() as conn:
        keys = await q.links_with_pending_work(
            conn, page.after, page.limit, timedelta(seconds=page.min_age_seconds)
        )
        facts = await link_facts(conn, keys)
    gate = asyncio.Semaphore(WAKE_CONCURRENCY)

    async def wake(key: str) -> None:
        async with gate:
            await wake_link(client, task_queue, key, None, facts=facts.get(key))

    await asyncio.gather(*(wake(key) for key in keys))
    if keys:
        async with pool.acquire() as conn:
            await q.woken(conn, keys)
    full = len(keys) == page.limit
    return RelayPageResult(woken=len(keys), last_key=keys[-1] if full else None)
