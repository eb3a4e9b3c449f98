"""Remote rate limits across every worker (SPEC PROF-3, NF-8): Temporal's matching
dispatches, a slot in Postgres spaces (see `protocol.rate_limit`); the send window that
bounds each request is `services.send_window`, read from the rates cached here.

Remote activities (POST, PATCH, locator look-ups) carry their budget's fairness
key and a weight; the server limits each key to the task queue's default
fairness rate scaled by the task's weight. The default is set high, so
activities without a key (every local step) are not slowed, and each limited
budget's weight brings its key down to its own pace. Each such activity then
reserves its budget's next slot (`reserve_pace`) and waits for it before sending.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import asyncpg
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import RateLimit
from temporalio.api.workflowservice.v1 import UpdateTaskQueueConfigRequest
from temporalio.client import Client

from db.bounded import bounded_transaction
from db.budget_pace import reserve_slot
from db.notify import PACKS_CHANGED_CHANNEL, database_key, listening
from db.rate_limits import select_link_budget_row
from db.records import Conn
from protocol.rate_limit import (
    CATCH_UP_S,
    MAX_SLOTS_MISSED,
    RemoteBudgetResult,
    SendWindow,
    budget_key,
    budget_rates,
    budget_result,
    budget_windows,
    destination_budget,
    fairness_weight,
    pace_slot,
    slot_missed,
)
from protocol.snapshots import CreateRequestSnapshot
from services.logthrottle import ThrottledLog
from services.packs import active_manifests, get_install

# Requests/s of a key at weight 1: keyless activities share the "" key at this rate.
FAIRNESS_DEFAULT_PER_SECOND = 1000.0
_IDENTITY = "connector-push rate limits"

log = logging.getLogger(__name__)
warn = ThrottledLog(log)


async def remote_budget(conn: Conn, link_key: str) -> RemoteBudgetResult:
    """The link's fairness key when its budget is limited; no key otherwise (PROF-3)."""
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


# Declared rates of the active packs, cached per pool. Beside a `pack_change_listener`
# the cache holds until a pack changes (no periodic transaction, P2); without one (a
# listener that could not start or was lost, a short-lived pool) it is re-read at most
# this often, so a pack's new limit applies within the interval.
RATES_TTL_S: Final = 10.0


@dataclass
class _RateCache:
    rates: dict[str, float] | None = None
    windows: dict[str, SendWindow] = field(default_factory=dict)  # read with `rates`
    read_generation: int = -1  # the generation the cached rates were read at
    generation: int = 0  # bumped by every pack change notification
    expires: float = 0.0
    listeners: int = 0  # pack change listeners running on this database

    def fresh(self, now: float) -> bool:
        if self.rates is None or self.read_generation != self.generation:
            return False
        return self.listeners > 0 or now < self.expires

    def invalidate(self) -> None:
        self.generation += 1


# Per database (every pool on it sees the same packs), for the life of the process.
_caches: dict[str, _RateCache] = {}

# Task queues whose budgets this process turned on (`ensure_fairness_limit`).
_paced_queues: set[str] = set()


# One refresh at a time per database and event loop: a burst of saves reads the packs
# once. (An asyncio lock belongs to one loop; loops, unlike pools, take weak references.)
_refreshing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _cache(pool: asyncpg.Pool) -> _RateCache:
    return _caches.setdefault(database_key(pool), _RateCache())


def _lock(pool: asyncpg.Pool) -> asyncio.Lock:
    locks = _refreshing.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault(database_key(pool), asyncio.Lock())


async def _fresh_cache(pool: asyncpg.Pool) -> _RateCache:
    cache = _cache(pool)
    async with _lock(pool):
        if not cache.fresh(time.monotonic()):
            # A change notified while this read runs bumps the generation again, so the
            # rates read here are used for this call only and re-read on the next.
            generation = cache.generation
            async with bounded_transaction(pool) as conn:
                manifests = await active_manifests(conn)
            cache.rates, cache.windows = budget_rates(manifests), budget_windows(manifests)
            cache.read_generation = generation
            cache.expires = time.monotonic() + RATES_TTL_S
        assert cache.rates is not None
        return cache


async def _cached_rates(pool: asyncpg.Pool) -> dict[str, float]:
    return (await _fresh_cache(pool)).rates or {}


async def cached_send_window(pool: asyncpg.Pool, key: str) -> SendWindow | None:
    """Budget `key`'s send window from the cached packs (NF-8'); None: not limited."""
    return (await _fresh_cache(pool)).windows.get(key)


@asynccontextmanager
async def pack_change_listener(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """While the block runs, `pool`'s cached budget rates are re-read only after a pack
    change (migration 0011 notifies). If the listener cannot start, the block runs with
    the timed re-read and a warning: pacing is best effort, admission is not held up."""
    cache = _cache(pool)
    running = False

    def lost() -> None:
        nonlocal running
        if running:
            running = False
            cache.listeners -= 1
        cache.invalidate()

    async with AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(
                listening(pool, PACKS_CHANGED_CHANNEL, cache.invalidate, lost)
            )
        except (OSError, TimeoutError, asyncpg.PostgresError) as error:
            log.warning(
                "pack change listener not started (%s): budget rates re-read every %.0f s",
                type(error).__name__,
                RATES_TTL_S,
            )
        else:
            running = True
            cache.listeners += 1
            cache.invalidate()  # rates read before LISTEN took effect may be stale
        try:
            yield
        finally:
            lost()


async def warm_budget_rates(pool: asyncpg.Pool) -> None:
    """Read the budget rates now, so the first save does not wait for them."""
    await _cached_rates(pool)


async def reservation_budget(
    pool: asyncpg.Pool, request: CreateRequestSnapshot
) -> RemoteBudgetResult:
    """The budget a reserved create spends, from its frozen credential and scope (PROF-3),
    so the CRM entry can start the link's workflow already paced."""
    key = budget_key(request.remote_scope, request.profile.credential_ref)
    return budget_result(key, await _cached_rates(pool), FAIRNESS_DEFAULT_PER_SECOND)


async def queued_patch_budget(pool: asyncpg.Pool, key: str) -> RemoteBudgetResult:
    """The budget a queued PATCH spends (its key decided at admission), from the cached
    rates, so the CRM entry can start the link's run already paced (PROF-3, NF-6)."""
    return budget_result(key, await _cached_rates(pool), FAIRNESS_DEFAULT_PER_SECOND)


async def current_budget_rates(pool: asyncpg.Pool) -> dict[str, float]:
    """Each limited budget's paced rate, from every active pack, read in one transaction
    (one snapshot of which installs are active, and one round of commits, not one each).
    Cancelled under a deadline, it leaves at once even if Postgres has stopped answering."""
    async with bounded_transaction(pool) as conn:
        return budget_rates(await active_manifests(conn))


async def ensure_fairness_limit(client: Client, task_queue: str) -> None:
    """Set the activity task queue's per-key default rate, which task weights scale down.

    Idempotent and independent of the packs: each budget's pace travels with its tasks
    (the weight is resolved from Postgres per run), so a newly applied pack applies at
    once. Queue weight overrides did not scale the limit on Server 1.32 (measured);
    task weights do. Set at worker start and by `pack apply`, so it survives a reset.
    This process's remote activities on the queue then also wait for their budget's
    slots in Postgres (`reserve_pace`).
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
    _paced_queues.add(task_queue)


async def reserve_pace(
    pool: asyncpg.Pool,
    task_queue: str,
    fairness_key: str | None,
    fairness_weight: float | None,
) -> float | None:
    """Reserve the next request slot of the budget an activity with this key and weight
    spends and wait for it (NF-8). None: sent now or after the wait; a float: the slot
    is further off than a remote activity may wait, nothing was reserved, and the caller
    should come back in that many seconds (a workflow timer).

    Only on a task queue whose budgets this process turned on (`ensure_fairness_limit`:
    every `connector-push worker` at start): an in-process worker of a test or a bench
    that never did runs unpaced, as Temporal's matching did for it before."""
    slot = pace_slot(fairness_key, fairness_weight, FAIRNESS_DEFAULT_PER_SECOND)
    if slot is None or task_queue not in _paced_queues:
        return None
    loop = asyncio.get_running_loop()
    missed = 0
    while True:
        async with pool.acquire() as conn:
            answer = await reserve_slot(
                conn, slot.budget_key, slot.interval_s, CATCH_UP_S, slot.max_wait_s
            )
        wait = answer.wait_s
        if not answer.reserved:
            return max(1.0, wait - slot.max_wait_s / 2)  # back with a slot in reach
        if wait <= 0:
            return None
        due = loop.time() + wait
        await asyncio.sleep(wait)  # pacing: the slot is the condition, reserved above
        if missed == MAX_SLOTS_MISSED or not slot_missed(loop.time() - due):
            return None
        # Woke too late (this process stalled): the slot is spent unused and the next
        # one reserved, so the sends a stall held back go out at the pace again.
        missed += 1
        warn.warning(
            "remote budget %s: a slot missed (the process stalled); reserving again",
            slot.budget_key,
        )
