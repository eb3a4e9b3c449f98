"""ING-1 / NF-5 across ingress processes: two transactions admitting the same events (or
receipts) in opposite request orders both commit; neither is a deadlock's victim.

An insert that meets another transaction's uncommitted row with the same key waits for
that transaction. Inserted in request order, `[b, a]` in one process against `[a, b]` in
another waits in a cycle, and Postgres aborts one of them (a 503 for a valid request).
The interleaving is forced, without timing: a third transaction holds key `x`, so the
one inserting `[b, x, a]` stops at `x`; the other starts `[a, b]` and stops on it; then
`x` is released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
import pytest

from db.ingress_queries import (
    EventRow,
    ReceiptRow,
    admit_events,
    insert_events,
    insert_receipts,
)
from tests.e2e.support import eventually

Insert = Callable[[asyncpg.Connection, Sequence[str]], Awaitable[object]]


def _events(keys: Sequence[str]) -> list[EventRow]:
    return [EventRow(k, "crm", "contact.deletion", "remote_deletion", "{}", f"r-{k}") for k in keys]


def _receipts(keys: Sequence[str]) -> list[ReceiptRow]:
    return [ReceiptRow(k, "crm", "request", None, None, None, "{}") for k in keys]


INSERTS: dict[str, Insert] = {
    "group commit, events": lambda conn, keys: admit_events(conn, _events(keys), []),
    "group commit, receipts": lambda conn, keys: admit_events(conn, [], _receipts(keys)),
    "one request, events": lambda conn, keys: insert_events(conn, _events(keys)),
    "one request, receipts": lambda conn, keys: insert_receipts(conn, _receipts(keys)),
}
TABLES = {"events": ("connector_event", "event_id"), "receipts": ("ingress_receipt", "receipt_id")}


async def _waits_on_a_lock(observer: asyncpg.Connection, conn: asyncpg.Connection) -> bool:
    state = await observer.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", conn.get_server_pid()
    )
    return bool(state == "Lock")


async def _stopped(observer: asyncpg.Connection, conn: asyncpg.Connection) -> None:
    await eventually(lambda: _waits_on_a_lock(observer, conn), bool, timeout_s=10.0)


@pytest.mark.parametrize("case", list(INSERTS))
async def test_ing1_the_same_rows_in_opposite_orders_commit_in_both_transactions(
    db_dsn: str, case: str
) -> None:
    insert = INSERTS[case]
    holder, forward, backward, observer = [await asyncpg.connect(db_dsn) for _ in range(4)]
    pending: list[asyncio.Task[object]] = []
    try:
        held = holder.transaction()
        await held.start()
        await insert(holder, ["x"])
        backward_tx, forward_tx = backward.transaction(), forward.transaction()
        await backward_tx.start()
        await forward_tx.start()
        backward_insert = asyncio.ensure_future(insert(backward, ["b", "x", "a"]))
        pending.append(backward_insert)
        await _stopped(observer, backward)  # at "x" (or, in key order, after "a", "b")
        forward_insert = asyncio.ensure_future(insert(forward, ["a", "b"]))
        pending.append(forward_insert)
        await _stopped(observer, forward)  # on a row `backward` inserted
        await held.rollback()
        await backward_insert  # in request order it now waits on "a": a deadlock
        await backward_tx.commit()
        await forward_insert
        await forward_tx.commit()
        table, key = TABLES[case.rsplit(", ", 1)[1]]
        stored = await observer.fetch(f"SELECT {key} FROM {table}")
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for conn in (holder, forward, backward, observer):
            conn.terminate()
    assert {r[key] for r in stored} == {"a", "b", "x"}
