"""Fault-test helpers: workers a test can stop and restart, and a steerable dispatch hook.

`Rig` owns the workers of one test's task queue, so a test can stop the worker
mid-activity (simulating a crash or a deploy) and start a fresh one, exactly as
an operator's process manager would.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import asyncpg
import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from cli.stack.devconfig import load_dev_config
from cli.stack.process import free_port
from cli.stack.temporal import TemporalDevServer
from sandbox.client import SandboxClient
from services.dispatch_hooks import DispatchHooks
from tests.e2e.conftest import Stack
from worker.runtime import build_worker, remote_http_client

# A stopped test worker cancels in-flight activities almost at once: a crash, not a drain.
CRASH_SHUTDOWN = timedelta(milliseconds=200)

Callback = Callable[[str], Awaitable[None]]


class SteerableHooks(DispatchHooks):
    """Runs `before` (if set) at the checkpoint seam; with `hold_first`, the first try
    waits there until `release` is set, recording its activity task token."""

    def __init__(self, *, hold_first: bool = False) -> None:
        self.before: Callback | None = None
        self.hold_first = hold_first
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.held_task_token: bytes | None = None
        self.tries = 0

    async def before_checkpoint(self, attempt_id: str) -> None:
        self.tries += 1
        if self.before is not None:
            await self.before(attempt_id)
        if self.hold_first and self.tries == 1:
            self.held_task_token = activity.info().task_token
            self.held.set()
            await self.release.wait()


@dataclass
class _Running:
    worker: Worker
    http: httpx.AsyncClient
    task: asyncio.Task[None]


@dataclass
class Rig:
    """The `Stack` of a test plus control over the workers serving its task queue."""

    stack: Stack
    client: Client
    pool: asyncpg.Pool
    task_queue: str
    running: list[_Running] = field(default_factory=list)

    async def start_worker(
        self, hooks: DispatchHooks | None = None, graceful: timedelta = CRASH_SHUTDOWN
    ) -> None:
        http = remote_http_client()
        worker = build_worker(
            self.client, self.pool, http, self.task_queue, hooks=hooks, graceful_shutdown=graceful
        )
        task = asyncio.create_task(worker.run())
        self.running.append(_Running(worker, http, task))

    async def stop_worker(self) -> None:
        """Stop the oldest running worker (cancelling its activities after `graceful`)."""
        running = self.running.pop(0)
        await running.worker.shutdown()
        with contextlib.suppress(asyncio.CancelledError):
            await running.task
        await running.http.aclose()

    async def close(self) -> None:
        await self.stack.close()
        while self.running:
            await self.stop_worker()


@contextlib.contextmanager
def private_temporal(
    workdir: Path, extra_args: list[str] | None = None
) -> Iterator[TemporalDevServer]:
    """A Temporal dev server of the test's own (the session's server is shared), e.g.
    to stop it or to start it with other dynamic config."""
    base = load_dev_config().temporal
    config = base.model_copy(update={"frontend_port": free_port(), "ui_port": free_port()})
    server = TemporalDevServer(
        config=config,
        db_file=workdir / "temporal.sqlite",
        ui=False,
        log_path=workdir / "log",
        extra_args=extra_args or [],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def rig_on(
    server: TemporalDevServer, pool: asyncpg.Pool, sandbox: SandboxClient, prefix: str
) -> AsyncIterator[Rig]:
    """A `Rig` whose workers and client talk to `server` on a task queue of its own."""
    await server.wait_ready()
    client = await Client.connect(
        server.address, namespace=server.config.namespace, data_converter=pydantic_data_converter
    )
    task_queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    rig = Rig(Stack(pool, client, task_queue, sandbox), client, pool, task_queue)
    try:
        yield rig
    finally:
        await rig.close()
