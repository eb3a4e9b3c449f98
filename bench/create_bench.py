"""The product's side of P1: a round of creates through the CRM entry (creates/s, CPU per
create, P2's Postgres transactions per create), the PATCH round, and P8 (Temporal Cloud
billable actions per create and per PATCH, beside the floor's). bench/p1_bench.py runs
them interleaved with the floor rounds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
from temporalio.client import Client

from bench.actions import billable_actions, total
from bench.cpu import cpu_seconds, ms_per_unit
from bench.floor_rounds import POOL_SIZE, bounded, floor_ids, floor_runs, floor_worker
from bench.stack import BenchStack, record_id
from bench.xacts import IDLE_FLUSH_S, settled
from db.pool import create_pool
from db.records import Conn
from protocol.admission import CreateReserved, PatchQueued, SaveRequest
from protocol.identity import link_workflow_id
from services.rate_limit import pack_change_listener, warm_budget_rates
from services.record_loader import load_records, parse_records_document
from worker.crm import report_save
from worker.runtime import build_worker, remote_http_client

QUEUE = "connector-push-bench"
FLOOR_SAMPLE = 20  # floor runs whose histories are counted (they are all alike)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _save(i: int) -> SaveRequest:
    return SaveRequest(
        connector_owner_key="demo-owner",
        action_slot_id="push-contact",
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id=record_id(i),
        originating_user_id="bench",
    )


async def floor_actions(client: Client, prefix: str) -> tuple[float, float]:
    """The floor's actions per create (its first run) and per PATCH (a second
    signal-with-start of the same id: the floor's run for it is a new run)."""
    ids = floor_ids(prefix, FLOOR_SAMPLE)
    created = await _actions_of(client, ids)
    async with floor_worker(client):
        await floor_runs(client, ids)
    return _mean(created), _mean(await _actions_of(client, ids))


# -- the create path -------------------------------------------------------------------


async def _wait_for(conn: Conn, query: str, n: int) -> int:
    """Poll `query` (a count) until it reaches `n`; returns how many polls (transactions).
    Bounded: a wake-up the CRM entry deferred to the relay (the bench runs none) would
    otherwise wait forever."""
    polls = 0
    async with asyncio.timeout(120 + n):
        while True:
            polls += 1
            if await conn.fetchval(query) >= n:
                return polls
            await asyncio.sleep(0.05)


FINALIZED = "SELECT count(*) FROM connector_push_attempt WHERE status = 'finalized'"
PATCHED = "SELECT count(*) FROM connector_patch_dispatch WHERE status = 'succeeded'"


@dataclass(frozen=True)
class Round:
    creates_per_s: float
    transactions_per_create: float | None  # counted when the round was asked to
    link_workflow_ids: list[str]
    cpu_ms: dict[str, float]  # CPU per create, by component (bench.cpu)


async def create_round(
    client: Client,
    stack: BenchStack,
    first: int,
    n: int,
    count: bool = True,
    sandboxed: bool = True,
) -> Round:
    """Creates per second through the CRM entry until every attempt is finalized,
    and (`count`) Postgres transactions per create over the same window. `sandboxed=False`
    runs the product's workflows outside the sandbox (bench/sandbox_cost.py only)."""
    stats = await asyncpg.connect(stack.admin_dsn)
    # Every connection is opened before the window: P2 counts the transactions a create
    # costs, not a connection's set-up (a backend's start runs a transaction of its own),
    # the pack change listener's LISTEN, the budget-rate cache's warm-up (as in `push`:
    # read once, kept until a pack changes) or the worker's start.
    pool = await create_pool(stack.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE)
    try:
        async with pack_change_listener(pool):
            await warm_budget_rates(pool)
            try:
                async with (
                    remote_http_client() as http,
                    build_worker(client, pool, http, QUEUE, sandboxed=sandboxed),
                    pool.acquire() as watcher,
                ):
                    before = await settled(stats, hold_s=IDLE_FLUSH_S) if count else 0
                    cpu_before = cpu_seconds(stack.processes)
                    elapsed, polls, ids = await _creates(client, pool, watcher, first, n)
                    cpu = ms_per_unit(cpu_before, cpu_seconds(stack.processes), n)
            finally:
                await pool.close()  # a closing backend flushes its counters at once
            after = await settled(stats) if count else 0  # before the listener's closes
    finally:
        await stats.close()
    xacts = (after - before - polls) / n if count else None
    return Round(n / elapsed, xacts, ids, cpu)


async def _creates(
    client: Client, pool: asyncpg.Pool, watcher: Conn, first: int, n: int
) -> tuple[float, int, list[str]]:
    """Seconds until N saves are finalized (the worker already polling), the progress
    polls spent watching, and the link workflows the saves woke."""
    started = time.monotonic()

    async def save(i: int) -> object:
        return await report_save(pool, client, QUEUE, _save(first + i))

    decisions = await bounded(n, save)
    assert all(isinstance(d, CreateReserved) for d in decisions), decisions[:3]
    polls = await _wait_for(watcher, FINALIZED, first + n)
    keys = [d.reservation.link_key for d in decisions if isinstance(d, CreateReserved)]
    return time.monotonic() - started, polls, [link_workflow_id(k) for k in keys]


@asynccontextmanager
async def product_worker(client: Client, dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """The product's worker on the bench queue, and a pool for the CRM entry."""
    pool = await create_pool(dsn, min_size=4, max_size=POOL_SIZE)
    try:
        async with remote_http_client() as http, build_worker(client, pool, http, QUEUE):
            yield pool
    finally:
        await pool.close()


async def patch_round(client: Client, pool: asyncpg.Pool, first: int, n: int) -> None:
    """Change records first..first+n-1 and report each save: one PATCH per finalized link."""
    numbers = range(first, first + n)
    records = [
        {"object": "Contact", "id": record_id(i), "fields": {"LastName": f"P{i}"}} for i in numbers
    ]
    async with pool.acquire() as conn:
        await load_records(conn, parse_records_document({"records": records}))

    async def save(i: int) -> object:
        return await report_save(pool, client, QUEUE, _save(first + i))

    decisions = await bounded(n, save)
    assert all(isinstance(d, PatchQueued) for d in decisions), decisions[:3]
    async with pool.acquire() as watcher:
        await _wait_for(watcher, PATCHED, n)


# -- P8: billable actions --------------------------------------------------------------


SETTLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RunActions:
    run_id: str
    counts: Counter[str]


async def _run_actions(client: Client, workflow_id: str, run_id: str | None = None) -> RunActions:
    """The billable actions of one run (the latest if `run_id` is None), once it has no
    workflow task and no activity pending: a finalized attempt is committed before the
    run's last task, so a history read at once could miss what that task does."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async with asyncio.timeout(SETTLE_TIMEOUT_S):
        while True:
            described = await handle.describe()
            raw = described.raw_description
            if not raw.HasField("pending_workflow_task") and not raw.pending_activities:
                break
            await asyncio.sleep(0.1)  # poll interval; the description is the condition
    run = client.get_workflow_handle(workflow_id, run_id=described.run_id)
    history = await run.fetch_history()
    return RunActions(described.run_id, billable_actions(list(history.events)))


async def _runs_of(client: Client, workflow_ids: Sequence[str]) -> list[RunActions]:
    async def count(i: int) -> RunActions:
        return await _run_actions(client, workflow_ids[i])

    return [r for r in await bounded(len(workflow_ids), count) if isinstance(r, RunActions)]


async def _actions_of(client: Client, workflow_ids: Sequence[str]) -> list[Counter[str]]:
    return [run.counts for run in await _runs_of(client, workflow_ids)]


async def _since(client: Client, workflow_id: str, before: RunActions) -> Counter[str]:
    """The actions a workflow id cost after `before` was read: the rest of that run (if it
    was still open) and the latest run, if the PATCH's signal-with-start opened one (a
    run that ended with its work, WF-1'). A run between the two would be missed; one
    save per link opens at most one."""
    latest = await _run_actions(client, workflow_id)
    if latest.run_id == before.run_id:
        return latest.counts - before.counts
    again = await _run_actions(client, workflow_id, before.run_id)
    return latest.counts + (again.counts - before.counts)


def _mean(counts: Sequence[Counter[str]]) -> float:
    return sum(total(c) for c in counts) / len(counts)


def _breakdown(counts: Sequence[Counter[str]]) -> str:
    summed: Counter[str] = sum(counts, Counter())
    return ", ".join(f"{k} {v / len(counts):.2f}" for k, v in sorted(summed.items()))


@dataclass(frozen=True)
class ActionFigures:
    create: float
    patch: float
    floor_create: float
    floor_patch: float


async def action_figures(
    client: Client, stack: BenchStack, first: int, ids: list[str], floor_prefix: str
) -> ActionFigures:
    """P8 from a create round's link workflows (records `first`.. onwards), then from the
    PATCH round over them; the floor's from the floor round named `floor_prefix`."""
    async with product_worker(client, stack.dsn) as pool:  # the runs' last tasks need one
        created = await _runs_of(client, ids)
        log(f"P8 create actions per link: {_breakdown([r.counts for r in created])}")
        await patch_round(client, pool, first, len(ids))

        async def since(i: int) -> Counter[str]:
            return await _since(client, ids[i], created[i])

        deltas = [c for c in await bounded(len(ids), since) if isinstance(c, Counter)]
    log(f"P8 PATCH actions per link: {_breakdown(deltas)}")
    floor_create, floor_patch = await floor_actions(client, floor_prefix)
    return ActionFigures(
        create=_mean([r.counts for r in created]),
        patch=_mean(deltas),
        floor_create=floor_create,
        floor_patch=floor_patch,
    )
