"""Durable admission (SPEC ING-1): one transaction per request, acknowledged after commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Final

import asyncpg

from db.bounded import bounded_transaction, server_refused
from db.ingress_queries import (
    ActionExecutionRow,
    EventRow,
    ReceiptRow,
    insert_action_execution,
    insert_events,
    insert_receipts,
    select_one,
)
from ingress.config import ConfigError
from ingress.errors import DropReason, Unavailable
from ingress.group_commit import GroupCommitter
from services.logthrottle import ThrottledLog

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

COMMIT_TIMEOUT_S: Final = 1.0


def _unavailable(exc: Exception) -> Unavailable:
    """`admission_failed` when the server answered and refused the admission; anything
    else - no connection, a connection lost or ended by the server (shutdown, starting
    up, terminated) - is the dependency being down: `database_unavailable` (ING-2)."""
    # Only the exception type is logged: messages can carry payload fragments.
    warn.warning("admission failed: %s", type(exc).__name__)
    if server_refused(exc):
        return Unavailable(DropReason.ADMISSION_FAILED)
    return Unavailable(DropReason.DATABASE_UNAVAILABLE)


PROBE_TIMEOUT_S: Final = 2.0


class DatabaseUrlUnreadable(ConfigError):
    """`DATABASE_URL` is not a DSN asyncpg can read: no connection could ever be made."""


def check_database_url(dsn: str) -> None:
    """Refuse, before serving, a DSN asyncpg cannot read (the lazy pool below would answer
    503 for ever). A server that is down, slow or refusing is not refused here: the
    ingress comes up and answers 503 until Postgres is back (ING-5)."""

    async def probe() -> None:
        conn = await asyncio.wait_for(asyncpg.connect(dsn), PROBE_TIMEOUT_S)
        await conn.close()

    try:
        asyncio.run(probe())
    except (ValueError, OverflowError):  # asyncpg's ClientConfigurationError is a ValueError
        raise DatabaseUrlUnreadable(
            "DATABASE_URL is not a DSN Postgres's driver can read "
            "(postgresql://user:password@host:port/database); fix the variable "
            "(its value is not shown)"
        ) from None
    except Exception as exc:  # down, slow, refused: serve, and answer 503 until it is back
        log.warning(
            "Postgres not usable at start (%s); answering 503 until it is", type(exc).__name__
        )


class Admitter:
    """Commits receipts and events over a pool it opens and closes (the app's lifespan)."""

    def __init__(
        self,
        database_url: str,
        pool_max_size: int = 20,
        *,
        group_commit: bool = True,
        commit_timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        self._database_url = database_url
        self._pool_max_size = pool_max_size
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        # Webhook admissions share transactions under load (see ingress/group_commit.py);
        # a shared commit outliving every request's deadline is abandoned.
        self._group = (
            GroupCommitter(lambda: self.pool, commit_timeout_s=commit_timeout_s)
            if group_commit
            else None
        )

    async def open(self) -> None:
        # min_size=0: no connection at start, so the process comes up (and answers
        # 503, not ready) while Postgres is down.
        self._pool = await asyncpg.create_pool(
            self._database_url, min_size=0, max_size=self._pool_max_size, timeout=2.0
        )
        if self._group is not None:
            self._group.start()

    async def close(self) -> None:
        if self._group is not None:
            await self._group.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool[asyncpg.Record]:
        if self._pool is None:
            raise Unavailable(DropReason.DATABASE_UNAVAILABLE)
        return self._pool

    async def admit_events(
        self, events: Sequence[EventRow], receipts: Sequence[ReceiptRow]
    ) -> list[str]:
        """Commit, in one transaction, new events and every receipt; returns new event ids."""
        try:
            if self._group is not None:
                return await self._group.admit(events, receipts)
            async with bounded_transaction(self.pool) as conn:
                new_ids = await insert_events(conn, events)
                await insert_receipts(conn, receipts)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:
            raise _unavailable(exc) from None
        return new_ids

    @property
    def group_commits(self) -> int | None:
        """Transactions the group committer has committed (None when it is off)."""
        return self._group.commits if self._group is not None else None

    @property
    def group_isolations(self) -> int | None:
        """Shared transactions the server refused and that were retried one by one."""
        return self._group.isolations if self._group is not None else None

    async def admit_action(
        self, receipt: ReceiptRow, execution: ActionExecutionRow
    ) -> datetime | None:
        """Commit a must-complete execution with its receipt; None if already admitted."""
        try:
            async with bounded_transaction(self.pool) as conn:
                await insert_receipts(conn, [receipt])
                return await insert_action_execution(conn, execution)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:
            raise _unavailable(exc) from None

    async def ready(self, timeout_s: float) -> bool:
        """Can a transaction commit right now? Answers within `timeout_s` (NF-5)."""
        try:
            async with asyncio.timeout(timeout_s), bounded_transaction(self.pool) as conn:
                await select_one(conn)
        except Exception as exc:
            warn.warning("readiness check failed: %s", type(exc).__name__)
            return False
        return True
