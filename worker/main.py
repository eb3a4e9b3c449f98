"""The worker process: one composition root wiring settings, telemetry, pool and client."""

from __future__ import annotations

import asyncio
import logging
import signal

from db.pool import create_pool
from worker.client import connect_temporal, sdk_runtime
from worker.observability import configure_logging, configure_tracing
from worker.runtime import (
    build_worker,
    ensure_rate_limits,
    ensure_search_attributes,
    remote_http_client,
    run_until,
)
from worker.schedules import ensure_relay_schedule
from worker.settings import RuntimeSettings

log = logging.getLogger(__name__)


async def run_worker(settings: RuntimeSettings, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or SIGINT/SIGTERM when no event is given)."""
    configure_logging(settings)
    configure_tracing(settings, "connector-push-worker")
    stop = stop or _stop_on_signals()
    client = await connect_temporal(settings, sdk_runtime(settings))
    await ensure_search_attributes(client)
    await ensure_relay_schedule(client, settings.task_queue)
    pool = await create_pool(settings.require_database_url(), min_size=2, max_size=20)
    try:
        await ensure_rate_limits(client, pool, settings.task_queue)
        async with remote_http_client() as http:
            worker = build_worker(
                client,
                pool,
                http,
                settings.task_queue,
                max_cached_workflows=settings.max_cached_workflows,
            )
            await run_until(stop, worker)
    finally:
        await pool.close()


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
