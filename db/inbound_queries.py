"""Named queries for processing admitted events and must-complete executions (ING-6, ING-7).

Each function runs one statement; the caller owns the transaction. Every state
change is a compare-and-set on the expected status or phase (ARCH-2): `None` or
`False` back means the row was not in that state.
"""

from __future__ import annotations

from asyncpg import Record

from db.records import Conn
from protocol.action_callback import ActionPhase, CompletionState, ExecutionView, StopReason
from protocol.inbound import EventStatus, EventView

SELECT_EVENT = """
SELECT event_id, handler, status, status_reason, target_object, remote_object_id, remote_scope
FROM connector_event WHERE event_id = $1
"""

OWNING_LINKS = """
SELECT link_key FROM connector_remote_link
WHERE target_object = $1 AND remote_id = $2 AND remote_scope = $3 AND status = 'finalized'
ORDER BY link_key
"""

SETTLE_EVENT = """
UPDATE connector_event SET status = $2, status_reason = $3, updated_at = now()
WHERE event_id = $1 AND status = 'admitted'
RETURNING status
"""

SELECT_EXECUTION = """
SELECT execution_id, callback_id, phase, expires_at, endpoint, event_id, outcome,
       callback_status, stop_reason
FROM workflow_action_execution WHERE execution_id = $1
"""

# The execution's own event: its id is the execution's, so a retried enqueue
# finds the row it already wrote.
INSERT_EXECUTION_EVENT = """
INSERT INTO connector_event (
    event_id, endpoint, event_type, handler, payload, first_receipt_id,
    target_object, remote_object_id, remote_scope
)
SELECT execution_id, endpoint, 'action:' || action_id, coalesce(handler, 'unrouted'), payload,
       receipt_id, target_object, remote_object_id, remote_scope
FROM workflow_action_execution WHERE execution_id = $1
ON CONFLICT (event_id) DO NOTHING
"""

MARK_ENQUEUED = """
UPDATE workflow_action_execution SET phase = 'enqueued', event_id = $1, updated_at = now()
WHERE execution_id = $1 AND phase = 'admitted'
RETURNING execution_id
"""

MARK_OBSERVED = """
UPDATE workflow_action_execution SET phase = 'observed', outcome = $2, updated_at = now()
WHERE execution_id = $1 AND phase = 'enqueued'
RETURNING execution_id
"""

RECORD_CALLBACK_ATTEMPT = """
UPDATE workflow_action_execution
SET callback_status = $2, callback_attempts = callback_attempts + 1, updated_at = now()
WHERE execution_id = $1 AND phase = 'observed'
RETURNING execution_id
"""

MARK_DELIVERED = """
UPDATE workflow_action_execution SET phase = 'delivered', updated_at = now()
WHERE execution_id = $1 AND phase = 'observed'
RETURNING execution_id
"""

MARK_STOPPED = """
UPDATE workflow_action_execution
SET phase = 'stopped', stop_reason = $2, updated_at = now()
WHERE execution_id = $1 AND phase IN ('admitted', 'enqueued', 'observed')
RETURNING execution_id
"""


def _event(row: Record) -> EventView:
    return EventView(
        event_id=row["event_id"],
        handler=row["handler"],
        status=EventStatus(row["status"]),
        status_reason=row["status_reason"],
        target_object=row["target_object"],
        remote_object_id=row["remote_object_id"],
        remote_scope=row["remote_scope"],
    )


def _execution(row: Record) -> ExecutionView:
    return ExecutionView(
        execution_id=row["execution_id"],
        callback_id=row["callback_id"],
        phase=ActionPhase(row["phase"]),
        expires_at=row["expires_at"],
        endpoint=row["endpoint"],
        event_id=row["event_id"],
        outcome=CompletionState(row["outcome"]) if row["outcome"] else None,
        callback_status=row["callback_status"],
        stop_reason=row["stop_reason"],
    )


async def select_event(conn: Conn, event_id: str) -> EventView | None:
    row = await conn.fetchrow(SELECT_EVENT, event_id)
    return None if row is None else _event(row)


async def owning_links(
    conn: Conn, target_object: str, remote_id: str, remote_scope: str
) -> list[str]:
    """Finalized links whose remote object is (`target_object`, `remote_id`) in that scope."""
    rows = await conn.fetch(OWNING_LINKS, target_object, remote_id, remote_scope)
    return [str(r["link_key"]) for r in rows]


async def settle_event(conn: Conn, event_id: str, status: EventStatus, reason: str) -> bool:
    """admitted -> `status` with `reason`; False if the event was already settled."""
    return await conn.fetchval(SETTLE_EVENT, event_id, status.value, reason) is not None


async def select_execution(conn: Conn, execution_id: str) -> ExecutionView | None:
    row = await conn.fetchrow(SELECT_EXECUTION, execution_id)
    return None if row is None else _execution(row)


async def insert_execution_event(conn: Conn, execution_id: str) -> None:
    """Enqueue the execution's local work as a connector_event (idempotent)."""
    await conn.execute(INSERT_EXECUTION_EVENT, execution_id)


async def mark_enqueued(conn: Conn, execution_id: str) -> bool:
    return await conn.fetchval(MARK_ENQUEUED, execution_id) is not None


async def mark_observed(conn: Conn, execution_id: str, outcome: CompletionState) -> bool:
    return await conn.fetchval(MARK_OBSERVED, execution_id, outcome.value) is not None


async def record_callback_attempt(conn: Conn, execution_id: str, status: int | None) -> bool:
    return await conn.fetchval(RECORD_CALLBACK_ATTEMPT, execution_id, status) is not None


async def mark_delivered(conn: Conn, execution_id: str) -> bool:
    return await conn.fetchval(MARK_DELIVERED, execution_id) is not None


async def mark_stopped(conn: Conn, execution_id: str, reason: StopReason) -> bool:
    return await conn.fetchval(MARK_STOPPED, execution_id, reason.value) is not None
