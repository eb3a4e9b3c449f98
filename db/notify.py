"""LISTEN beside a pool: Postgres delivers a notification only to a session that listens,
so a listener is its own connection, opened with the pool's connection arguments."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Final

import asyncpg

# Written by the trigger of migration 0011 after any statement on pack_install.
PACKS_CHANGED_CHANNEL: Final = "connector_packs_changed"
CLOSE_TIMEOUT_S: Final = 2.0


def _connect_arguments(pool: asyncpg.Pool) -> tuple[list[Any], dict[str, Any]]:
    """asyncpg has no public accessor for a pool's connection arguments; the private pair
    is read because holding a pooled connection for LISTEN would make `pool.close()`
    wait for it forever, and a LISTEN left on a pooled connection would outlive its use."""
    args: list[Any] = getattr(pool, "_connect_args")  # noqa: B009 (private, see above)
    kwargs: dict[str, Any] = getattr(pool, "_connect_kwargs")  # noqa: B009
    return args, kwargs


def database_key(pool: asyncpg.Pool) -> str:
    """Which database `pool` reaches, as a key for per-database caches (pools are not
    weak-referenceable). Holds the connection arguments: never log it."""
    args, kwargs = _connect_arguments(pool)
    return repr((args, sorted(kwargs.items())))


@asynccontextmanager
async def listening(
    pool: asyncpg.Pool,
    channel: str,
    on_notify: Callable[[], None],
    on_lost: Callable[[], None],
) -> AsyncIterator[None]:
    """Call `on_notify` for each notification on `channel` until the block exits, and
    `on_lost` if the connection ends first. LISTEN has taken effect when the block starts."""
    args, kwargs = _connect_arguments(pool)
    conn = await asyncpg.connect(*args, **kwargs)
    try:
        conn.add_termination_listener(lambda _conn: on_lost())
        await conn.add_listener(channel, lambda *_args: on_notify())
        yield
    finally:
        with suppress(Exception):  # closing is best effort: a dead server must not hang us
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await conn.close()
        if not conn.is_closed():
            conn.terminate()
