"""`python -m bench`: P1 (creates/s over the floor's workflows/s) and P2 (Postgres
transactions per create), then P3, P7 and P6 from their own modules, all written to
bench/results/latest.json."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.rate_limit import pack_change_listener, warm_budget_rates
from bench.floor import FloorInput, FloorWorkflow, floor_noop
from bench.ingress_bench import run_ingress_bench
from bench.rate_bench import run_rate_bench
from bench.saves_bench import run_saves_bench
from bench.stack import DATABASE, BenchStack, bench_stack, record_id
from db.pool import create_pool
from protocol.admission import CreateReserved, SaveRequest
from worker.crm import report_save
from worker.runtime import build_worker, remote_http_client

N = int(os.environ.get("BENCH_N", "300"))
CONCURRENCY = 50  # saves (or floor starts) in flight at once, like a busy CRM
POOL_SIZE = 40


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


async def _bounded(n: int, job: Callable[[int], Awaitable[object]]) -> list[object]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> object:
        async with gate:
            return await job(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def floor_rate(client: Client, n: int) -> float:
    """Floor workflows per second: signal-with-start, one no-op activity, completed."""
    queue = "bench-floor"
    async with Worker(client, task_queue=queue, workflows=[FloorWorkflow], activities=[floor_noop]):
        started = time.monotonic()

        async def run(i: int) -> object:
            handle = await client.start_workflow(
                FloorWorkflow.run,
                FloorInput(key=f"floor-{i}"),
                id=f"floor/{i}",
                task_queue=queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                start_signal="poke",
            )
            return await handle.result()

        await _bounded(n, run)
        return n / (time.monotonic() - started)


async def _xact_commits(stats: asyncpg.Connection) -> int:
    """Committed transactions of the bench database, read from another database so the
    reading itself is not counted (each autocommit statement reads fresh stats)."""
    value = await stats.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", DATABASE
    )
    return int(value)


async def _settled(stats: asyncpg.Connection) -> int:
    """Backends flush their counters within about a second of going idle: wait for a
    reading that holds still."""
    last = await _xact_commits(stats)
    while True:
        await asyncio.sleep(1.2)
        now = await _xact_commits(stats)
        if now == last:
            return now
        last = now


async def _wait_finalized(dsn: str, n: int) -> int:
    """Poll until every attempt is finalized; returns how many polls (transactions) it took."""
    conn = await asyncpg.connect(dsn)
    polls = 0
    try:
        while True:
            polls += 1
            done = await conn.fetchval(
                "SELECT count(*) FROM connector_push_attempt WHERE status = 'finalized'"
            )
            if done >= n:
                return polls
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def create_rate(client: Client, stack: BenchStack, n: int) -> tuple[float, float]:
    """Creates per second through the CRM entry until every attempt is finalized,
    and Postgres transactions per create over the same window."""
    queue = "connector-push-bench"
    stats = await asyncpg.connect(stack.admin_dsn)
    # Every connection is opened before the window: P2 counts the transactions a create
    # costs, not the pool's warm-up (a connection's set-up runs statements of its own).
    pool = await create_pool(stack.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE)
    try:
        # Likewise the per-process cache of budget rates: read once and kept until a pack
        # changes, as in `push` and the ingress (not a cost of each create).
        async with pack_change_listener(pool):
            await warm_budget_rates(pool)
            before = await _settled(stats)
            try:
                elapsed, polls = await _creates(client, pool, queue, stack.dsn, n)
            finally:
                await pool.close()  # a closing backend flushes its counters at once
        after = await _settled(stats)
    finally:
        await stats.close()
    return n / elapsed, (after - before - polls) / n


async def _creates(
    client: Client, pool: asyncpg.Pool, queue: str, dsn: str, n: int
) -> tuple[float, int]:
    """Seconds until N saves are finalized, and the progress polls spent watching."""
    async with remote_http_client() as http, build_worker(client, pool, http, queue):
        started = time.monotonic()

        async def save(i: int) -> object:
            request = SaveRequest(
                connector_owner_key="demo-owner",
                action_slot_id="push-contact",
                destination_slot_id="remote-contacts",
                source_object="Contact",
                source_record_id=record_id(i),
                originating_user_id="bench",
            )
            return await report_save(pool, client, queue, request)

        decisions = await _bounded(n, save)
        assert all(isinstance(d, CreateReserved) for d in decisions), decisions[:3]
        polls = await _wait_finalized(dsn, n)
        return time.monotonic() - started, polls


def _write(results: dict[str, float]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**existing, **results}, indent=2, sort_keys=True) + "\n")


async def main() -> None:
    async with bench_stack(N) as stack:
        log("stack up; running the floor")
        floor = await floor_rate(stack.client, N)
        log(f"floor: {floor:.1f} workflows/s")
        creates, per_create = await create_rate(stack.client, stack, N)
    p1, p2 = creates / floor, per_create
    print(f"N={N}  floor {floor:.1f} workflows/s  creates {creates:.1f}/s")
    print(f"P1 = {p1:.2f} (target >= 0.8)   P2 = {p2:.2f} transactions/create (target <= 3)")
    _write({"P1": round(p1, 3), "P2": round(p2, 3)})
    await run_ingress_bench()  # P3 (issue 7): its own Postgres; merges into the same file
    await run_saves_bench()  # P7 (issue 12): the HTTP save API, likewise
    await run_rate_bench()  # P6 (issue 12): push against a rate-limited remote, two workers


if __name__ == "__main__":
    asyncio.run(main())
