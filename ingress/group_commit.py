"""Group commit (ING-1 at throughput): concurrent admissions share one transaction.

A request's rows join a queue; a committer takes everything queued when it is
free (no timer: batches form only under load, so an idle ingress adds no
latency), inserts it in one transaction and resolves each request only after
that COMMIT returned. A request whose deadline passed before the commit is
withdrawn: the committer notices before committing, rolls back, and commits the
rest without it, so a 503 never leaves its rows behind (the same race as a
single-request commit remains: a deadline firing *during* COMMIT answers 503 for
rows that are stored, which the sender's retry then finds by identity).

A request fails alone: what the database cannot store is refused before it
queues (protocol/storable.py), and a shared transaction the server still refuses
is retried member by member, so only the culprit gets the error. A commit that
outlives its time bound terminates the connection instead of awaiting it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import asyncpg

from db.bounded import (
    Connection,
    is_usable,
    rollback_or_terminate,
    server_refused,
    terminate,
)
from db.ingress_queries import EventRow, ReceiptRow, admit_events

MAX_BATCH: Final = 64
# One committer: while its transaction is in flight the next batch gathers, so
# transactions per request fall (measured under P3 load: 3.4 -> 5.2 requests per
# transaction, ~12% less ingress and ~20% less Postgres CPU per request than two
# committers). A committer's round trips, not its statements, are what cost.
COMMITTERS: Final = 1


@dataclass
class _Pending:
    events: Sequence[EventRow]
    receipts: Sequence[ReceiptRow]
    done: asyncio.Future[list[str]]


def _split_new_ids(batch: Sequence[_Pending], new_ids: Sequence[str]) -> list[list[str]]:
    """Each request's newly created event ids; an id in two requests counts for the first."""
    remaining = set(new_ids)
    split = []
    for pending in batch:
        mine = [e.event_id for e in pending.events if e.event_id in remaining]
        remaining.difference_update(mine)
        split.append(mine)
    return split


class GroupCommitter:
    """Owns its committer tasks; `start` in the app's lifespan, `close` at shutdown."""

    def __init__(
        self,
        pool: Callable[[], asyncpg.Pool],
        max_batch: int = MAX_BATCH,
        committers: int = COMMITTERS,
        commit_timeout_s: float = 1.0,
    ) -> None:
        self._pool = pool
        self._commit_timeout_s = commit_timeout_s
        self._max_batch = max_batch
        self._committers = committers
        self._queue: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.commits = 0  # transactions committed (observability and tests)
        self.isolations = 0  # shared transactions the server refused, retried one by one

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(self._committers)]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._queue:
            self._queue.popleft().done.cancel()

    async def admit(self, events: Sequence[EventRow], receipts: Sequence[ReceiptRow]) -> list[str]:
        """Returns this request's new event ids once they are committed; raises what the
        commit raised. Cancelling the caller withdraws the rows if not yet committed."""
        done: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(events, receipts, done))
        self._wake.set()
        return await done

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        while self._queue and len(batch) < self._max_batch:
            pending = self._queue.popleft()
            if not pending.done.done():  # a withdrawn request is dropped here
                batch.append(pending)
        return batch

    async def _run(self) -> None:
        # Each committer keeps one connection between batches: a pool release would
        # cost a reset round trip per batch. A failed batch terminates it (the server
        # may be hung) and the next batch acquires afresh.
        conn: Connection | None = None
        try:
            while True:
                if not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                batch = self._take()
                if batch:
                    conn = await self._commit(conn, batch)
        finally:
            if conn is not None:
                terminate(conn)

    async def _commit(self, conn: Connection | None, batch: list[_Pending]) -> Connection | None:
        """Commit the batch (resolving its requests); returns the connection to keep.

        Bounded in time: a server that stops answering mid-transaction costs the
        connection (terminated, never awaited), not the committer (NF-5)."""
        try:
            async with asyncio.timeout(self._commit_timeout_s):
                if conn is None or not is_usable(conn):  # e.g. the server reset it
                    conn = await self._pool().acquire()
                await self._commit_isolated(conn, batch)
        except asyncio.CancelledError:  # shutting down: nothing of this batch committed
            for pending in batch:
                pending.done.cancel()
            raise
        except Exception as exc:
            _fail(batch, exc)
            if conn is not None:
                terminate(conn)
            return None
        return conn

    async def _commit_isolated(self, conn: Connection, batch: list[_Pending]) -> None:
        """The batch in one transaction; if the server refuses it, each request in its
        own, so only the culprit gets the error (NF-5: one request fails alone)."""
        try:
            await self._commit_members(conn, batch)
        except Exception as exc:
            if len(batch) == 1 or not server_refused(exc):
                raise
            self.isolations += 1
            for pending in batch:
                try:
                    await self._commit_members(conn, [pending])
                except Exception as culprit:
                    if not server_refused(culprit):
                        raise
                    _fail([pending], culprit)

    async def _commit_members(self, conn: Connection, batch: list[_Pending]) -> None:
        """Commit the requests still waiting among `batch` and resolve them."""
        live = [p for p in batch if not p.done.done()]
        while live:
            new_ids = await self._try_commit(conn, live)
            if new_ids is not None:
                for pending, mine in zip(live, _split_new_ids(live, new_ids), strict=True):
                    if not pending.done.done():
                        pending.done.set_result(mine)
                return
            live = [p for p in live if not p.done.done()]

    async def _try_commit(self, conn: Connection, batch: list[_Pending]) -> list[str] | None:
        """Insert and commit the batch; None (rolled back) if a request withdrew meanwhile."""
        transaction = conn.transaction()
        await transaction.start()
        try:
            new_ids = await admit_events(
                conn, [e for p in batch for e in p.events], [r for p in batch for r in p.receipts]
            )
        except BaseException as exc:
            if server_refused(exc):
                await rollback_or_terminate(conn, transaction)
            raise
        if any(p.done.done() for p in batch):
            await transaction.rollback()
            return None
        await transaction.commit()
        self.commits += 1
        return new_ids


def _fail(batch: Sequence[_Pending], exc: Exception) -> None:
    for pending in batch:
        if not pending.done.done():
            pending.done.set_exception(exc)
