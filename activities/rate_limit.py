"""Remote rate limits across every worker (SPEC PROF-3), enforced by Temporal's matching.

Remote activities (POST, PATCH, locator look-ups) carry their budget's fairness
key and a weight; the server limits each key to the task queue's default
fairness rate scaled by the task's weight. The default is set high, so
activities without a key (every local step) are not slowed, and each limited
budget's weight brings its key down to its own pace. Measured on the dev server
(Server 1.32, one task-queue partition): see the commit introducing this module.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Final

import asyncpg
from temporalio import activity
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import RateLimit
from temporalio.api.workflowservice.v1 import UpdateTaskQueueConfigRequest
from temporalio.client import Client

from activities.packs import active_manifests, get_install
from db.rate_limits import select_link_budget_row
from db.records import Conn
from protocol.rate_limit import (
    RemoteBudgetInput,
    RemoteBudgetResult,
    budget_key,
    budget_rates,
    budget_result,
    destination_budget,
    fairness_weight,
)
from protocol.snapshots import CreateRequestSnapshot

# Requests/s of a key at weight 1: keyless activities share the "" key at this rate.
FAIRNESS_DEFAULT_PER_SECOND = 1000.0
_IDENTITY = "connector-push rate limits"


class RateLimitActivities:
    """Resolves which budget a link spends; runs as a local activity (Postgres only)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn
    async def remote_budget(self, input: RemoteBudgetInput) -> RemoteBudgetResult:
        """The link's fairness key when its budget is limited; no key otherwise."""
        async with self._pool.acquire() as conn:
            return await _remote_budget(conn, input.link_key)


async def _remote_budget(conn: Conn, link_key: str) -> RemoteBudgetResult:
    row = await select_link_budget_row(conn, link_key)
    install = await get_install(conn, row.pack_install_id) if row else None
    if row is None or install is None:
        return RemoteBudgetResult()  # nothing to send; the dispatch says why
    manifests = [install.manifest, *await active_manifests(conn)]
    budget = destination_budget(manifests, install.manifest, row.destination_slot_id)
    if budget is None or budget.per_second is None:
        return RemoteBudgetResult()
    weight = fairness_weight(budget.per_second, FAIRNESS_DEFAULT_PER_SECOND)
    return RemoteBudgetResult(fairness_key=budget.key, fairness_weight=weight)


# Declared rates of the active packs, re-read at most this often per process: a wake-up
# costs no Postgres round trip (P2), and a pack's new limit applies within the interval.
RATES_TTL_S: Final = 10.0
_rates: tuple[float, dict[str, float]] | None = None
# One refresh at a time per event loop: a burst of saves reads the packs once.
_refreshing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


async def _cached_rates(pool: asyncpg.Pool) -> dict[str, float]:
    global _rates
    lock = _refreshing.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        now = time.monotonic()
        if _rates is None or _rates[0] < now:
            _rates = (now + RATES_TTL_S, await current_budget_rates(pool))
        return _rates[1]


async def reservation_budget(
    pool: asyncpg.Pool, request: CreateRequestSnapshot
) -> RemoteBudgetResult:
    """The budget a reserved create spends, from its frozen credential and scope (PROF-3),
    so the CRM entry can start the link's workflow already paced."""
    key = budget_key(request.remote_scope, request.profile.credential_ref)
    return budget_result(key, await _cached_rates(pool), FAIRNESS_DEFAULT_PER_SECOND)


async def current_budget_rates(pool: asyncpg.Pool) -> dict[str, float]:
    """Each limited budget's paced rate, from every active pack, read in one transaction
    (one snapshot of which installs are active, and one round of commits, not one each)."""
    async with pool.acquire() as conn, conn.transaction():
        return budget_rates(await active_manifests(conn))


async def ensure_fairness_limit(client: Client, task_queue: str) -> None:
    """Set the activity task queue's per-key default rate, which task weights scale down.

    Idempotent and independent of the packs: each budget's pace travels with its tasks
    (the weight is resolved from Postgres per run), so a newly applied pack applies at
    once. Queue weight overrides did not scale the limit on Server 1.32 (measured);
    task weights do. Set at worker start and by `pack apply`, so it survives a reset.
    """
    default = UpdateTaskQueueConfigRequest.RateLimitUpdate(
        rate_limit=RateLimit(requests_per_second=FAIRNESS_DEFAULT_PER_SECOND),
        reason="connector-push: keyless activities unlimited; budgets paced by weight (PROF-3)",
    )
    await client.workflow_service.update_task_queue_config(
        UpdateTaskQueueConfigRequest(
            namespace=client.namespace,
            identity=_IDENTITY,
            task_queue=task_queue,
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            update_fairness_key_rate_limit_default=default,
        )
    )
