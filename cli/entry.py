"""What the CRM-entry commands (`save`, `push`) share: Postgres first, Temporal best effort.

Admission never waits on Temporal (SPEC API-2): the pool opens (or the command
fails with one clear line), the saves are admitted, and only then is a Temporal
client sought, bounded in time; without one the wake-ups are deferred to the relay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import asyncpg
from rich.console import Console
from rich.markup import escape
from temporalio.client import Client

from cli.errors import fail
from cli.stack.devconfig import load_dev_config
from db.pool import create_pool
from worker.client import connect_temporal
from worker.settings import RuntimeSettings

CONNECT_TIMEOUT_S: Final = 3.0
DEFERRED_WARNING: Final = (
    "warning: Temporal is unreachable; the admission stands and the wake-up is deferred "
    "(the relay dispatches it once Temporal is back)"
)

_stderr = Console(stderr=True)


def runtime_settings() -> RuntimeSettings:
    """The environment's settings, with the dev stack's Temporal address as the default."""
    settings = RuntimeSettings()
    address = settings.temporal_address or load_dev_config().temporal.address
    return settings.model_copy(update={"temporal_address": address})


@asynccontextmanager
async def admission_pool(dsn: str, max_size: int = 2) -> AsyncIterator[asyncpg.Pool]:
    """A pool for in-process admission; an unreachable database is one clear error."""
    try:
        pool = await asyncio.wait_for(create_pool(dsn, min_size=1, max_size=max_size), 10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        fail(escape(f"cannot reach Postgres ({type(exc).__name__}: {exc}); nothing was admitted"))
    try:
        yield pool
    finally:
        await pool.close()


async def connect_best_effort(settings: RuntimeSettings) -> Client | None:
    """A Temporal client, or None (after a warning) when the server does not answer soon."""
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            return await connect_temporal(settings)
    except Exception:  # any failure to connect: the relay covers the wake-up
        warn_deferred()
        return None


def warn_deferred() -> None:
    _stderr.print(f"[yellow]{DEFERRED_WARNING}[/]", highlight=False, soft_wrap=True)
