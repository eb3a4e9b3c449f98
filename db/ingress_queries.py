"""Named queries for the ingress inbox. Each function runs one statement; the caller
owns the transaction (STYLE rule 7)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from db.records import Conn


class EventRow(NamedTuple):
    event_id: str
    endpoint: str
    event_type: str
    handler: str
    payload: str
    first_receipt_id: str
    target_object: str | None = None
    remote_object_id: str | None = None
    remote_scope: str | None = None


class ReceiptRow(NamedTuple):
    receipt_id: str
    endpoint: str
    request_id: str
    event_id: str | None
    event_type: str | None
    attempt: str | None
    payload: str


class UnstartedExecution(NamedTuple):
    execution_id: str
    endpoint: str
    callback_id: str


class ActionExecutionRow(NamedTuple):
    execution_id: str
    endpoint: str
    callback_id: str
    action_id: str
    receipt_id: str
    payload: str
    expiration: timedelta
    handler: str | None = None
    target_object: str | None = None
    remote_object_id: str | None = None
    remote_scope: str | None = None


# Rows go in in key order (ORDER BY ... COLLATE "C", as `lock_link_keys` locks): an
# insert meeting another transaction's uncommitted row with the same key waits for it,
# so two ingress processes inserting the same events in opposite orders would each wait
# on the other (a deadlock: a 503 for both). Every statement here inserts events, then
# receipts, each in that one global order, so no two of them can wait in a cycle.
INSERT_EVENTS = """
INSERT INTO connector_event (
    event_id, endpoint, event_type, handler, payload, first_receipt_id,
    target_object, remote_object_id, remote_scope
)
SELECT * FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
    $9::text[]
) AS e (
    event_id, endpoint, event_type, handler, payload, first_receipt_id,
    target_object, remote_object_id, remote_scope
)
ORDER BY event_id COLLATE "C"
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id
"""

INSERT_RECEIPTS = """
INSERT INTO ingress_receipt
    (receipt_id, endpoint, request_id, event_id, event_type, attempt, payload)
SELECT * FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]
) AS r (receipt_id, endpoint, request_id, event_id, event_type, attempt, payload)
ORDER BY receipt_id COLLATE "C"
ON CONFLICT (receipt_id) DO NOTHING
"""

# Events and their receipts in one statement (one round trip for a group commit).
# The receipts' foreign key to connector_event is checked at the end of the
# statement, so a receipt may name an event inserted by the sibling CTE. Postgres
# runs `new_events` as the main query reads it, and `new_receipts` (read by nothing)
# to completion after that: events first, then receipts, as the two statements above.
ADMIT_EVENTS = """
WITH new_events AS (
    INSERT INTO connector_event (
        event_id, endpoint, event_type, handler, payload, first_receipt_id,
        target_object, remote_object_id, remote_scope
    )
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
        $8::text[], $9::text[]
    ) AS e (
        event_id, endpoint, event_type, handler, payload, first_receipt_id,
        target_object, remote_object_id, remote_scope
    )
    ORDER BY event_id COLLATE "C"
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
), new_receipts AS (
    INSERT INTO ingress_receipt
        (receipt_id, endpoint, request_id, event_id, event_type, attempt, payload)
    SELECT * FROM unnest(
        $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[]
    ) AS r (receipt_id, endpoint, request_id, event_id, event_type, attempt, payload)
    ORDER BY receipt_id COLLATE "C"
    ON CONFLICT (receipt_id) DO NOTHING
)
SELECT event_id FROM new_events
"""

INSERT_ACTION_EXECUTION = """
INSERT INTO workflow_action_execution
    (execution_id, endpoint, callback_id, action_id, receipt_id, payload, expires_at,
     handler, target_object, remote_object_id, remote_scope)
VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval, $8, $9, $10, $11)
ON CONFLICT DO NOTHING
RETURNING expires_at
"""

MARK_EVENTS_STARTED = """
UPDATE connector_event SET workflow_started_at = now()
WHERE event_id = ANY($1::text[]) AND workflow_started_at IS NULL
"""

MARK_EXECUTION_STARTED = """
UPDATE workflow_action_execution SET workflow_started_at = now()
WHERE execution_id = $1 AND workflow_started_at IS NULL
"""

# The relay's backlog: rows committed a while ago whose workflow no one started.
UNSTARTED_EVENTS = """
SELECT event_id FROM connector_event
WHERE workflow_started_at IS NULL AND created_at <= now() - $1::interval
ORDER BY created_at LIMIT $2
"""

UNSTARTED_EXECUTIONS = """
SELECT execution_id, endpoint, callback_id FROM workflow_action_execution
WHERE workflow_started_at IS NULL AND created_at <= now() - $1::interval
ORDER BY created_at LIMIT $2
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


async def admit_events(
    conn: Conn, events: Sequence[EventRow], receipts: Sequence[ReceiptRow]
) -> list[str]:
    """`insert_events` then `insert_receipts`, as one statement. Returns the new event ids."""
    records = await conn.fetch(
        ADMIT_EVENTS,
        *_columns(events, len(EventRow._fields)),
        *_columns(receipts, len(ReceiptRow._fields)),
    )
    return [str(r["event_id"]) for r in records]


async def insert_action_execution(conn: Conn, row: ActionExecutionRow) -> datetime | None:
    """Admit a must-complete execution; None if this callback id was already admitted."""
    value = await conn.fetchval(INSERT_ACTION_EXECUTION, *row)
    assert value is None or isinstance(value, datetime)
    return value


async def select_one(conn: Conn) -> None:
    """The cheapest statement that proves the database answers."""
    await conn.fetchval(SELECT_ONE)


async def mark_events_started(conn: Conn, event_ids: Sequence[str]) -> None:
    """Record that processing workflows exist for these events (the relay skips them)."""
    await conn.execute(MARK_EVENTS_STARTED, list(event_ids))


async def mark_execution_started(conn: Conn, execution_id: str) -> None:
    await conn.execute(MARK_EXECUTION_STARTED, execution_id)


async def unstarted_events(conn: Conn, min_age: timedelta, limit: int) -> list[str]:
    """Events at least `min_age` old whose processing workflow was never started."""
    return [str(r["event_id"]) for r in await conn.fetch(UNSTARTED_EVENTS, min_age, limit)]


async def unstarted_executions(
    conn: Conn, min_age: timedelta, limit: int
) -> list[UnstartedExecution]:
    """Must-complete executions at least `min_age` old whose callback workflow never started."""
    rows = await conn.fetch(UNSTARTED_EXECUTIONS, min_age, limit)
    return [UnstartedExecution(r["execution_id"], r["endpoint"], r["callback_id"]) for r in rows]
