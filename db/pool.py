"""The runtime's asyncpg pool: one place for how connections are handed out and returned."""

from __future__ import annotations

from typing import Final

import asyncpg

# What opening a connection or pool raises when Postgres cannot be used: refused, DNS,
# unreachable (OSError), no answer in time (TimeoutError), a DSN asyncpg cannot read
# (ValueError, which includes its ClientConfigurationError), a port past 65535
# (OverflowError), or the server's refusal (auth, missing database). One tuple for the
# worker and every CLI entry point, so each turns all of them into "cannot reach Postgres".
CONNECT_ERRORS: Final = (OSError, TimeoutError, ValueError, OverflowError, asyncpg.PostgresError)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Return a connection without asyncpg's default reset query.

    The default (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`) is a
    round trip and a committed transaction on every release — a third of the create
    path's transactions. The runtime keeps no session state (advisory locks are
    transaction-scoped, no LISTEN, cursors or SET outside a transaction), and asyncpg
    still rolls back an open transaction before calling this.
    """
    del conn


async def create_pool(dsn: str, *, min_size: int, max_size: int) -> asyncpg.Pool:
    return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, reset=_keep_session)
