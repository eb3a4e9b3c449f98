"""Named queries for `connector-push forget` (SPEC S-7; migration 0225).

Every statement takes the record as `$1` (source object) and `$2` (record id) and
reaches the rows holding its values through the record's link keys (its attempts and
links) and remote objects (target object and remote id: webhook and workflow-action
rows name those). An erase sets `values_erased_at` and nothing else; the table's
trigger replaces the values with the marker and refuses an unfinished row, so a
statement here cannot erase what may still be sent or processed.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from db.records import Conn

# The record's link keys and remote objects; prefixed to each statement below.
_RECORD: Final = """
WITH keys AS (
    SELECT link_key FROM connector_push_attempt WHERE source_object = $1 AND source_record_id = $2
    UNION
    SELECT link_key FROM connector_remote_link WHERE source_object = $1 AND source_record_id = $2
), objects AS (
    SELECT target_object, remote_id FROM connector_remote_link
    WHERE source_object = $1 AND source_record_id = $2
    UNION
    SELECT r.target_object, a.remote_id
    FROM connector_push_attempt a JOIN connector_push_attempt_request r USING (attempt_id)
    WHERE a.source_object = $1 AND a.source_record_id = $2 AND a.remote_id IS NOT NULL
), events AS (
    SELECT e.event_id FROM connector_event e
    WHERE (e.target_object, e.remote_object_id) IN (SELECT target_object, remote_id FROM objects)
), executions AS (
    SELECT x.execution_id, x.receipt_id FROM workflow_action_execution x
    WHERE (x.target_object, x.remote_object_id) IN (SELECT target_object, remote_id FROM objects)
)
"""

UNFINISHED: Final = (
    _RECORD
    + """
SELECT 'attempt' AS kind, attempt_id::text AS id, status FROM connector_push_attempt
WHERE source_object = $1 AND source_record_id = $2
  AND status NOT IN ('finalized', 'superseded', 'terminal_failed')
UNION ALL
SELECT 'patch', patch_id::text, status FROM connector_patch_dispatch
WHERE link_key IN (SELECT link_key FROM keys)
  AND status NOT IN ('succeeded', 'failed', 'superseded')
UNION ALL
SELECT 'event', event_id, status FROM connector_event
WHERE event_id IN (SELECT event_id FROM events) AND status = 'admitted'
UNION ALL
SELECT 'action_execution', execution_id, phase FROM workflow_action_execution
WHERE execution_id IN (SELECT execution_id FROM executions)
  AND phase NOT IN ('delivered', 'stopped')
ORDER BY 1, 2
"""
)

_ERASED: Final = "\nSELECT count(*) FROM erased\n"


def _erase(table: str, rows: str) -> str:
    """Stamp `values_erased_at` on the record's not-yet-erased rows of `table` that `rows`
    names; the trigger of migration 0225 then swaps the values for the marker."""
    return (
        _RECORD
        + f""", erased AS (
    UPDATE {table} SET values_erased_at = now()
    WHERE ({rows}) AND values_erased_at IS NULL
    RETURNING 1
)"""
        + _ERASED
    )


# An attempt's values are in its frozen request (migration 0350).
ERASE_ATTEMPTS: Final = _erase(
    "connector_push_attempt_request",
    "attempt_id IN (SELECT attempt_id FROM connector_push_attempt"
    " WHERE source_object = $1 AND source_record_id = $2)",
)
ERASE_PATCHES: Final = _erase("connector_patch_dispatch", "link_key IN (SELECT link_key FROM keys)")
ERASE_EVENTS: Final = _erase("connector_event", "event_id IN (SELECT event_id FROM events)")
ERASE_ACTION_EXECUTIONS: Final = _erase(
    "workflow_action_execution", "execution_id IN (SELECT execution_id FROM executions)"
)
ERASE_RECEIPTS: Final = _erase(
    "ingress_receipt",
    "event_id IN (SELECT event_id FROM events)"
    " OR receipt_id IN (SELECT receipt_id FROM executions)",
)

# Stored save answers are idempotency records, not evidence: an answer naming one of the
# record's link keys goes whole (a batch answer with it), like retention's (OPS-3).
DELETE_SAVE_ANSWERS: Final = (
    _RECORD
    + """, erased AS (
    DELETE FROM save_api_request s
    WHERE EXISTS (SELECT 1 FROM keys k WHERE strpos(s.answer::text, k.link_key) > 0)
    RETURNING 1
)"""
    + _ERASED
)

ERASES: Final = {
    "attempts": ERASE_ATTEMPTS,
    "patches": ERASE_PATCHES,
    "events": ERASE_EVENTS,
    "action_executions": ERASE_ACTION_EXECUTIONS,
    "ingress_receipts": ERASE_RECEIPTS,
    "save_answers": DELETE_SAVE_ANSWERS,
}


class UnfinishedRow(NamedTuple):
    kind: str
    id: str
    status: str


async def unfinished(conn: Conn, source_object: str, record_id: str) -> list[UnfinishedRow]:
    """The record's rows that may still be sent or processed (forget refuses while any)."""
    rows = await conn.fetch(UNFINISHED, source_object, record_id)
    return [UnfinishedRow(r["kind"], r["id"], r["status"]) for r in rows]


async def erase(conn: Conn, kind: str, source_object: str, record_id: str) -> int:
    """Erase the record's values from one kind of row; how many rows were erased."""
    return int(await conn.fetchval(ERASES[kind], source_object, record_id))
