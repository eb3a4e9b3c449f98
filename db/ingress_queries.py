"""Named queries for the ingress inbox. Each function runs one statement; the caller
owns the transaction (STYLE rule 7)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple, TypeAlias

from asyncpg import Connection, Record
from asyncpg.pool import PoolConnectionProxy

Conn: TypeAlias = "Connection[Record] | PoolConnectionProxy[Record]"


class EventRow(NamedTuple):
    event_id: str
    endpoint: str
    event_type: str
    handler: str
    payload: str
    first_receipt_id: str


class ReceiptRow(NamedTuple):
    receipt_id: str
    endpoint: str
    request_id: str
    event_id: str | None
    event_type: str | None
    attempt: str | None
    payload: str


class ActionExecutionRow(NamedTuple):
    execution_id: str
    endpoint: str
    callback_id: str
    action_id: str
    receipt_id: str
    payload: str
    expiration: timedelta


INSERT_EVENTS = """
INSERT INTO connector_event (event_id, endpoint, event_type, handler, payload, first_receipt_id)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id
"""

INSERT_RECEIPTS = """
INSERT INTO ingress_receipt
    (receipt_id, endpoint, request_id, event_id, event_type, attempt, payload)
SELECT * FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]
)
ON CONFLICT (receipt_id) DO NOTHING
"""

INSERT_ACTION_EXECUTION = """
INSERT INTO workflow_action_execution
    (execution_id, endpoint, callback_id, action_id, receipt_id, payload, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval)
ON CONFLICT DO NOTHING
RETURNING expires_at
"""

SELECT_ONE = "SELECT 1"


def _columns(rows: Sequence[tuple[object, ...]], width: int) -> list[list[object]]:
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


async def insert_events(conn: Conn, rows: Sequence[EventRow]) -> list[str]:
    """Insert new events; an existing business identity is left alone. Returns the new ids."""
    records = await conn.fetch(INSERT_EVENTS, *_columns(rows, len(EventRow._fields)))
    return [str(r["event_id"]) for r in records]


async def insert_receipts(conn: Conn, rows: Sequence[ReceiptRow]) -> None:
    """Insert receipts; a receipt already stored (same transport attempt) is a no-op."""
    await conn.execute(INSERT_RECEIPTS, *_columns(rows, len(ReceiptRow._fields)))


async def insert_action_execution(conn: Conn, row: ActionExecutionRow) -> datetime | None:
    """Admit a must-complete execution; None if this callback id was already admitted."""
    value = await conn.fetchval(INSERT_ACTION_EXECUTION, *row)
    assert value is None or isinstance(value, datetime)
    return value


async def select_one(conn: Conn) -> None:
    """The cheapest statement that proves the database answers."""
    await conn.fetchval(SELECT_ONE)
