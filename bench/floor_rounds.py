"""Rounds of the floor workflow (bench/floor.py): with its no-op activity (P1's floor) or
with the I/O a create cannot avoid (P1_io's floor_io, bench/floor_io.py), and the
floor's billable actions (P8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import asyncpg
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from bench.cpu import cpu_seconds, ms_per_unit
from bench.floor import FloorInput, FloorWorkflow, floor_noop
from bench.floor_io import ACTIVITY, FloorIO, RowTemplate
from bench.p1_series import Rate
from bench.stack import BenchStack
from bench.xacts import IDLE_FLUSH_S, settled
from db.pool import create_pool
from worker.runtime import remote_http_client, workflow_runner

CONCURRENCY = 50  # saves (or floor starts) in flight at once, like a busy CRM
POOL_SIZE = 40  # the product round's pool, for the CRM entry and its worker
FLOOR_QUEUE = "bench-floor"
# settled_result: the longest a missed long-poll wake-up can cost; above a floor
# workflow's latency at 50 in flight (1.0-2.5 s here), so a round's other workflows
# are asked once, as before.
RESULT_ASK_AGAIN_S = 3.0


async def bounded(n: int, job: Callable[[int], Awaitable[object]]) -> list[object]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> object:
        async with gate:
            return await job(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


def floor_ids(prefix: str, n: int) -> list[str]:
    return [f"floor/{prefix}/{i}" for i in range(n)]


async def floor_runs(client: Client, ids: Sequence[str], activity: str = "floor_noop") -> float:
    """Signal-with-start one floor workflow per id and wait for each; returns seconds."""
    started = time.monotonic()

    async def run(i: int) -> object:
        handle = await client.start_workflow(
            FloorWorkflow.run,
            FloorInput(key=ids[i], activity=activity),
            id=ids[i],
            task_queue=FLOOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal="poke",
        )
        return await settled_result(handle)

    await bounded(len(ids), run)
    return time.monotonic() - started


async def settled_result(handle: WorkflowHandle[Any, Any]) -> object:
    """The workflow's result, asking again every RESULT_ASK_AGAIN_S.

    `handle.result()` long-polls the history, and the dev server sometimes misses the
    wake-up: measured, one floor_io workflow in a few thousand (in the same round of
    two runs) returned 20 s late, the server's long-poll expiry, although its history
    closed 1.1 s after its start. That one workflow made its round of 200 read 8.7/s instead of
    ~45, and a floor round read that slow inflates its pair's P1. The product's round
    watches Postgres, so only the floor was exposed. Asking again bounds a missed
    wake-up to RESULT_ASK_AGAIN_S."""
    while True:
        try:
            return await asyncio.wait_for(handle.result(), RESULT_ASK_AGAIN_S)
        except TimeoutError:
            continue


def floor_worker(client: Client, io: FloorIO | None = None, sandboxed: bool = True) -> Worker:
    """The floor's worker: the SDK's defaults (its sandbox included) unless `sandboxed` is
    False (bench/sandbox_cost.py measures the sandbox)."""
    activities: list[Callable[..., object]] = [floor_noop]
    if io is not None:
        activities.append(io.floor_io)
    return Worker(
        client,
        task_queue=FLOOR_QUEUE,
        workflows=[FloorWorkflow],
        activities=activities,
        workflow_runner=workflow_runner(sandboxed),  # the SDK's default runner when True
    )


async def floor_rate(client: Client, processes: Mapping[str, int], n: int, prefix: str) -> Rate:
    """Floor workflows per second: signal-with-start, one no-op activity, completed."""
    ids = floor_ids(prefix, n)
    async with floor_worker(client):
        before = cpu_seconds(processes)
        seconds = await floor_runs(client, ids)
        return Rate(n / seconds, ms_per_unit(before, cpu_seconds(processes), n))


async def floor_io_rate(
    stack: BenchStack,
    template: RowTemplate,
    n: int,
    prefix: str,
    count: bool,
    sandboxed: bool = True,
) -> Rate:
    """floor_io workflows per second, and (`count`) the Postgres transactions each cost,
    counted like P2: over a window whose connections were all open before it began."""
    ids = floor_ids(f"io-{prefix}", n)
    stats = await asyncpg.connect(stack.admin_dsn)
    pool = await create_pool(stack.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE)
    try:
        try:
            async with remote_http_client() as http:
                io = FloorIO(pool, http, stack.sandbox_url, template)
                async with floor_worker(stack.client, io, sandboxed):
                    before = await settled(stats, hold_s=IDLE_FLUSH_S) if count else 0
                    cpu_before = cpu_seconds(stack.processes)
                    seconds = await floor_runs(stack.client, ids, ACTIVITY)
                    cpu = ms_per_unit(cpu_before, cpu_seconds(stack.processes), n)
        finally:
            await pool.close()  # a closing backend flushes its counters at once
        after = await settled(stats) if count else 0
    finally:
        await stats.close()
    return Rate(n / seconds, cpu, (after - before) / n if count else None)
