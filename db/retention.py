"""Named queries for retention (SPEC OPS-3): one batch of one kind of finished row each.

Each statement deletes at most `$2` rows finished before `$1` and returns how many it
deleted; the caller loops until a batch comes back empty and owns the transaction.
The queries select only rows the guards allow, so a prune skips protected rows instead
of failing on them; the guards refuse anything else whatever a query asks (G-3:
migration 0170 for attempts, unsettled PATCHes and their journal rows; 0041 for the
inbox). Order matters only for foreign keys: executions, then receipts, then events;
PATCH journal rows go with their PATCH (ON DELETE CASCADE). Stored save answers (S-7)
are idempotency records, not evidence: any older than the cut-off goes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from db.records import Conn
from protocol.states import PatchStatus

# G-3: the only PATCH statuses whose row and send-journal rows may be deleted. Migration
# 0170 refuses every other one (tests/db/test_evidence_delete_guards.py checks each status
# against this set); `ambiguous_remote_effect` awaits an operator and is kept.
SETTLED_PATCH_STATUSES: Final[frozenset[PatchStatus]] = frozenset(
    {PatchStatus.SUCCEEDED, PatchStatus.FAILED, PatchStatus.SUPERSEDED}
)

DELETE_ACTION_EXECUTIONS: Final = """
WITH doomed AS (
    SELECT execution_id FROM workflow_action_execution
    WHERE phase IN ('delivered', 'stopped') AND updated_at < $1
    ORDER BY updated_at LIMIT $2
), gone AS (
    DELETE FROM workflow_action_execution
    WHERE execution_id IN (SELECT execution_id FROM doomed) RETURNING 1
)
SELECT count(*) FROM gone
"""

DELETE_INGRESS_RECEIPTS: Final = """
WITH doomed AS (
    SELECT r.receipt_id FROM ingress_receipt r
    WHERE r.received_at < $1
      AND (r.event_id IS NULL OR EXISTS (
            SELECT 1 FROM connector_event e
            WHERE e.event_id = r.event_id AND e.status <> 'admitted'))
      AND NOT EXISTS (SELECT 1 FROM workflow_action_execution x WHERE x.receipt_id = r.receipt_id)
    ORDER BY r.received_at LIMIT $2
), gone AS (
    DELETE FROM ingress_receipt WHERE receipt_id IN (SELECT receipt_id FROM doomed) RETURNING 1
)
SELECT count(*) FROM gone
"""

DELETE_EVENTS: Final = """
WITH doomed AS (
    SELECT e.event_id FROM connector_event e
    WHERE e.status <> 'admitted' AND e.updated_at < $1
      AND NOT EXISTS (SELECT 1 FROM ingress_receipt r WHERE r.event_id = e.event_id)
      AND NOT EXISTS (SELECT 1 FROM workflow_action_execution x WHERE x.event_id = e.event_id)
    ORDER BY e.updated_at LIMIT $2
), gone AS (
    DELETE FROM connector_event WHERE event_id IN (SELECT event_id FROM doomed) RETURNING 1
)
SELECT count(*) FROM gone
"""

DELETE_SAVE_ANSWERS: Final = """
WITH doomed AS (
    SELECT client_id, idempotency_key FROM save_api_request
    WHERE created_at < $1
    ORDER BY created_at LIMIT $2
), gone AS (
    DELETE FROM save_api_request
    WHERE (client_id, idempotency_key) IN (SELECT client_id, idempotency_key FROM doomed)
    RETURNING 1
)
SELECT count(*) FROM gone
"""

# Finished = `$4`, the settled statuses: any other PATCH stays (Postgres would refuse it).
# The newest `$3` PATCHes of each link stay whatever their age, and a PATCH another row
# names as `superseded_by` waits until that older row is gone.
DELETE_PATCHES: Final = """
WITH ranked AS (
    SELECT patch_id, status, updated_at,
           row_number() OVER (PARTITION BY link_key ORDER BY created_at DESC, patch_id DESC)
               AS newest
    FROM connector_patch_dispatch
), doomed AS (
    SELECT r.patch_id FROM ranked r
    WHERE r.newest > $3 AND r.status = ANY($4::text[])
      AND r.updated_at < $1
      AND NOT EXISTS (SELECT 1 FROM connector_patch_dispatch o WHERE o.superseded_by = r.patch_id)
    ORDER BY r.updated_at LIMIT $2
), journal AS (
    SELECT count(*) AS n FROM connector_send_journal
    WHERE patch_id IN (SELECT patch_id FROM doomed)
), gone AS (
    DELETE FROM connector_patch_dispatch WHERE patch_id IN (SELECT patch_id FROM doomed)
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS patches, (SELECT n FROM journal) AS journal
"""


async def delete_action_executions(conn: Conn, before: datetime, limit: int) -> int:
    return int(await conn.fetchval(DELETE_ACTION_EXECUTIONS, before, limit))


async def delete_ingress_receipts(conn: Conn, before: datetime, limit: int) -> int:
    return int(await conn.fetchval(DELETE_INGRESS_RECEIPTS, before, limit))


async def delete_events(conn: Conn, before: datetime, limit: int) -> int:
    return int(await conn.fetchval(DELETE_EVENTS, before, limit))


async def delete_save_answers(conn: Conn, before: datetime, limit: int) -> int:
    return int(await conn.fetchval(DELETE_SAVE_ANSWERS, before, limit))


async def delete_patches(conn: Conn, before: datetime, limit: int, keep: int) -> tuple[int, int]:
    """(PATCH rows, their journal rows) deleted."""
    settled = sorted(map(str, SETTLED_PATCH_STATUSES))
    row = await conn.fetchrow(DELETE_PATCHES, before, limit, keep, settled)
    assert row is not None
    return int(row["patches"]), int(row["journal"])
