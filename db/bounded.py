"""Transactions whose cleanup never waits on a server that stopped answering (NF-5).

A deadline cancels the request's statement, but the usual cleanup (ROLLBACK, then
the pool's reset on release) is more round trips to the same hung server, awaited
without limit. Here a failure the server itself reported is rolled back as usual
(it answered, so it is alive); anything else - a cancellation, a timeout, a broken
socket - terminates the connection at once. A terminated connection returns its
slot to the pool, which opens a fresh one on the next acquire.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final, TypeAlias

import asyncpg
from asyncpg.transaction import Transaction

Connection: TypeAlias = "asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"

# The cleanup ceiling (C-10, seed 004): the pool's reset of a released connection is
# bounded, and past it the pool terminates the connection, so a reset that hangs frees
# its pool slot within 200 ms.
RELEASE_TIMEOUT_S: Final = 0.2


def server_refused(exc: BaseException) -> bool:
    """Did the server answer this error (the connection is still usable)?"""
    return isinstance(exc, asyncpg.PostgresError) and not isinstance(
        exc,
        asyncpg.exceptions.PostgresConnectionError | asyncpg.exceptions.OperatorInterventionError,
    )


def is_usable(conn: Connection) -> bool:
    """Open and still ours: a connection whose socket closed under it has already been
    handed back to the pool, and every call on its proxy raises."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


def terminate(conn: Connection) -> None:
    """Close at once, without a round trip; a no-op on a proxy already given back."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


async def rollback_or_terminate(conn: Connection, transaction: Transaction) -> None:
    """Roll back after an error the server reported; terminate if even that fails (a
    cancellation still propagates; the caller is already raising the original error)."""
    try:
        await transaction.rollback()
    except BaseException as exc:
        terminate(conn)
        if not isinstance(exc, Exception):
            raise


@asynccontextmanager
async def bounded_transaction(pool: asyncpg.Pool) -> AsyncIterator[Connection]:
    """A pooled connection inside a transaction, committed when the block ends.

    Run it under the caller's deadline: a cancellation at any point leaves at once.
    """
    conn: Connection = await pool.acquire()
    transaction = conn.transaction()
    started = False
    try:
        await transaction.start()
        started = True
        yield conn
        await transaction.commit()
    except BaseException as exc:
        if not server_refused(exc) or not is_usable(conn):
            terminate(conn)
        elif started:  # BEGIN itself may be what the server refused
            await rollback_or_terminate(conn, transaction)
        raise
    finally:
        # A reset that fails or times out terminates the connection inside the pool;
        # nothing is left for us to do about it.
        with contextlib.suppress(Exception):
            await pool.release(conn, timeout=RELEASE_TIMEOUT_S)
