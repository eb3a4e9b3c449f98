"""The create path: P1 (creates/s over the floor's workflows/s), P2 (Postgres transactions
per create), P8 (Temporal Cloud billable actions per create and per PATCH, beside the
floor's), and growth (P1 and P2 again at a larger N in the same run and stack).

Each round saves fresh records, so the second round runs on tables, indexes and a
Temporal history store already holding the first round's rows: that is the growth.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from bench.actions import billable_actions, total
from bench.cpu import cpu_seconds, describe, ms_per_unit
from bench.floor import FloorInput, FloorWorkflow, floor_noop
from bench.stack import DATABASE, BenchStack, bench_stack, record_id
from db.pool import create_pool
from db.records import Conn
from protocol.admission import CreateReserved, PatchQueued, SaveRequest
from protocol.identity import link_workflow_id
from services.rate_limit import pack_change_listener, warm_budget_rates
from services.record_loader import load_records, parse_records_document
from worker.crm import report_save
from worker.runtime import build_worker, remote_http_client

CONCURRENCY = 50  # saves (or floor starts) in flight at once, like a busy CRM
POOL_SIZE = 40
QUEUE = "connector-push-bench"
FLOOR_QUEUE = "bench-floor"
FLOOR_SAMPLE = 20  # floor runs whose histories are counted (they are all alike)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _bounded(n: int, job: Callable[[int], Awaitable[object]]) -> list[object]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> object:
        async with gate:
            return await job(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


def _save(i: int) -> SaveRequest:
    return SaveRequest(
        connector_owner_key="demo-owner",
        action_slot_id="push-contact",
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id=record_id(i),
        originating_user_id="bench",
    )


# -- the floor -------------------------------------------------------------------------


async def _floor_runs(client: Client, ids: Sequence[str]) -> float:
    """Signal-with-start one floor workflow per id and wait for each; returns seconds."""
    started = time.monotonic()

    async def run(i: int) -> object:
        handle = await client.start_workflow(
            FloorWorkflow.run,
            FloorInput(key=ids[i]),
            id=ids[i],
            task_queue=FLOOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal="poke",
        )
        return await handle.result()

    await _bounded(len(ids), run)
    return time.monotonic() - started


def floor_prefix(n: int, first: int) -> str:
    return f"n{n}-{first}"


@dataclass(frozen=True)
class Rate:
    per_s: float
    cpu_ms: dict[str, float]  # CPU per workflow or create, by component (bench.cpu)


async def floor_rate(client: Client, processes: Mapping[str, int], n: int, prefix: str) -> Rate:
    """Floor workflows per second: signal-with-start, one no-op activity, completed."""
    ids = [f"floor/{prefix}/{i}" for i in range(n)]
    async with Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow],
                      activities=[floor_noop]):  # fmt: skip
        before = cpu_seconds(processes)
        seconds = await _floor_runs(client, ids)
        return Rate(n / seconds, ms_per_unit(before, cpu_seconds(processes), n))


async def floor_actions(client: Client, prefix: str) -> tuple[float, float]:
    """The floor's actions per create (its first run) and per PATCH (a second
    signal-with-start of the same id: the floor's run for it is a new run)."""
    ids = [f"floor/{prefix}/{i}" for i in range(FLOOR_SAMPLE)]
    created = await _actions_of(client, ids)
    async with Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow],
                      activities=[floor_noop]):  # fmt: skip
        await _floor_runs(client, ids)
    return _mean(created), _mean(await _actions_of(client, ids))


# -- the create path -------------------------------------------------------------------


async def _xact_commits(stats: asyncpg.Connection) -> int:
    """Committed transactions of the bench database, read from another database so the
    reading itself is not counted (each autocommit statement reads fresh stats)."""
    value = await stats.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", DATABASE
    )
    return int(value)


# An idle backend's pending counters reach pg_stat_database within PGSTAT_IDLE_INTERVAL
# (10 s) of its last transaction, or at once when it exits.
IDLE_FLUSH_S = 11.0


async def _settled(stats: asyncpg.Connection, hold_s: float = 1.2) -> int:
    """A reading of the counters that has held still for `hold_s`."""
    last, since = await _xact_commits(stats), time.monotonic()
    while time.monotonic() - since < hold_s:
        await asyncio.sleep(0.2)  # poll interval; the unchanged reading is the condition
        now = await _xact_commits(stats)
        if now != last:
            last, since = now, time.monotonic()
    return last


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
    transactions_per_create: float
    link_workflow_ids: list[str]
    cpu_ms: dict[str, float]  # CPU per create, by component (bench.cpu)


async def create_round(client: Client, stack: BenchStack, first: int, n: int) -> Round:
    """Creates per second through the CRM entry until every attempt is finalized,
    and Postgres transactions per create over the same window."""
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
                    build_worker(client, pool, http, QUEUE),
                    pool.acquire() as watcher,
                ):
                    before = await _settled(stats, hold_s=IDLE_FLUSH_S)
                    cpu_before = cpu_seconds(stack.processes)
                    elapsed, polls, ids = await _creates(client, pool, watcher, first, n)
                    cpu = ms_per_unit(cpu_before, cpu_seconds(stack.processes), n)
            finally:
                await pool.close()  # a closing backend flushes its counters at once
            after = await _settled(stats)  # before the listener's connection closes
    finally:
        await stats.close()
    return Round(n / elapsed, (after - before - polls) / n, ids, cpu)


async def _creates(
    client: Client, pool: asyncpg.Pool, watcher: Conn, first: int, n: int
) -> tuple[float, int, list[str]]:
    """Seconds until N saves are finalized (the worker already polling), the progress
    polls spent watching, and the link workflows the saves woke."""
    started = time.monotonic()

    async def save(i: int) -> object:
        return await report_save(pool, client, QUEUE, _save(first + i))

    decisions = await _bounded(n, save)
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


async def patch_round(client: Client, pool: asyncpg.Pool, dsn: str, n: int) -> None:
    """Change records 0..n-1 and report each save: one PATCH per finalized link."""
    records = [
        {"object": "Contact", "id": record_id(i), "fields": {"LastName": f"P{i}"}} for i in range(n)
    ]
    async with pool.acquire() as conn:
        await load_records(conn, parse_records_document({"records": records}))

    async def save(i: int) -> object:
        return await report_save(pool, client, QUEUE, _save(i))

    decisions = await _bounded(n, save)
    assert all(isinstance(d, PatchQueued) for d in decisions), decisions[:3]
    async with pool.acquire() as watcher:
        await _wait_for(watcher, PATCHED, n)


# -- P8: billable actions --------------------------------------------------------------


SETTLE_TIMEOUT_S = 120.0


async def _idle(client: Client, workflow_id: str) -> None:
    """Until the run has no workflow task and no activity pending: a finalized attempt
    is committed before the task that upserts the search attributes and starts the idle
    timer, so a history read at once would miss those."""
    handle = client.get_workflow_handle(workflow_id)
    async with asyncio.timeout(SETTLE_TIMEOUT_S):
        while True:
            raw = (await handle.describe()).raw_description
            if not raw.HasField("pending_workflow_task") and not raw.pending_activities:
                return
            await asyncio.sleep(0.1)  # poll interval; the description is the condition


async def _actions_of(client: Client, workflow_ids: Sequence[str]) -> list[Counter[str]]:
    async def count(i: int) -> Counter[str]:
        await _idle(client, workflow_ids[i])
        history = await client.get_workflow_handle(workflow_ids[i]).fetch_history()
        return billable_actions(list(history.events))

    return [c for c in await _bounded(len(workflow_ids), count) if isinstance(c, Counter)]


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


async def action_figures(client: Client, stack: BenchStack, ids: list[str]) -> ActionFigures:
    """P8 from the create round's link workflows, then from the PATCH round over them."""
    async with product_worker(client, stack.dsn) as pool:  # the runs' last tasks need one
        created = await _actions_of(client, ids)
        log(f"P8 create actions per link: {_breakdown(created)}")
        await patch_round(client, pool, stack.dsn, len(ids))
        patched = await _actions_of(client, ids)
    deltas = [after - before for after, before in zip(patched, created, strict=True)]
    log(f"P8 PATCH actions per link: {_breakdown(deltas)}")
    floor_create, floor_patch = await floor_actions(client, floor_prefix(len(ids), 0))
    return ActionFigures(
        create=_mean(created),
        patch=sum(total(a) - total(b) for a, b in zip(patched, created, strict=True)) / len(ids),
        floor_create=floor_create,
        floor_patch=floor_patch,
    )


# -- the run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class P1Round:
    floor: Rate
    created: Round
    # The floor again once the creates are done. P1 is against the floor before; the
    # second says how far the shared host drifted meanwhile, which bounds P1's meaning.
    floor_after: Rate

    @property
    def drift(self) -> float:
        return self.floor_after.per_s / self.floor.per_s - 1


async def _p1_round(client: Client, stack: BenchStack, first: int, n: int) -> P1Round:
    name = f"N={n}"
    log(f"{name}: floor")
    floor = await floor_rate(client, stack.processes, n, prefix=floor_prefix(n, first))
    log(f"{name}: floor {floor.per_s:.1f} workflows/s; creates")
    created = await create_round(client, stack, first, n)
    log(f"{name}: creates {created.creates_per_s:.1f}/s; the floor again")
    after = await floor_rate(client, stack.processes, n, prefix=f"{floor_prefix(n, first)}-after")
    result = P1Round(floor, created, after)
    print(
        f"{name}  floor {floor.per_s:.1f} workflows/s  creates {created.creates_per_s:.1f}/s  "
        f"P1 = {created.creates_per_s / floor.per_s:.2f} (target >= 0.8)  "
        f"P2 = {created.transactions_per_create:.2f} transactions/create (target <= 3)\n"
        f"  floor after the creates {after.per_s:.1f} workflows/s ({result.drift:+.0%})\n"
        f"  CPU per floor workflow: {describe(floor.cpu_ms)}\n"
        f"  CPU per create:         {describe(created.cpu_ms)}"
    )
    return result


def _p1_figures(name: str, p1: P1Round) -> dict[str, float]:
    """`name` (the ratio), the rates, and each side's CPU per unit by component."""
    created, floor = p1.created, p1.floor
    return {
        name: round(created.creates_per_s / floor.per_s, 3),
        f"{name}_creates_per_s": round(created.creates_per_s, 1),
        f"{name}_floor_per_s": round(floor.per_s, 1),
        f"{name}_floor_after_per_s": round(p1.floor_after.per_s, 1),
        **{f"{name}_cpu_ms_{part}": ms for part, ms in created.cpu_ms.items()},
        **{f"{name}_floor_cpu_ms_{part}": ms for part, ms in floor.cpu_ms.items()},
    }


async def run_create_bench(n: int, growth_n: int) -> dict[str, float]:
    """P1, P2 and P8 at N, then P1 and P2 at `growth_n` (0: skip) on the same stack."""
    results: dict[str, float] = {}
    async with bench_stack(n + growth_n) as stack:
        first = await _p1_round(stack.client, stack, 0, n)
        results |= _p1_figures("P1", first)
        results["P2"] = round(first.created.transactions_per_create, 3)
        p8 = await action_figures(stack.client, stack, first.created.link_workflow_ids)
        print(
            f"P8 = {p8.create:.2f} actions/create (target <= 4), {p8.patch:.2f} actions/PATCH "
            f"(target <= 3); the floor: {p8.floor_create:.2f} per create, "
            f"{p8.floor_patch:.2f} per PATCH"
        )
        results |= {
            "P8_create": round(p8.create, 2),
            "P8_patch": round(p8.patch, 2),
            "P8_floor_create": round(p8.floor_create, 2),
            "P8_floor_patch": round(p8.floor_patch, 2),
        }
        if growth_n:
            grown = await _p1_round(stack.client, stack, n, growth_n)
            results |= _p1_figures(f"P1_n{growth_n}", grown)
            results[f"P2_n{growth_n}"] = round(grown.created.transactions_per_create, 3)
    return results
