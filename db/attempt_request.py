"""The attempt's two rows (migration 0350): its state, `connector_push_attempt`, and what
admission froze, `connector_push_attempt_request`, whose profile and action snapshots are
stored once per content (`connector_frozen_snapshot`). Reads get the frozen request whole
from the view `connector_push_attempt_frozen`; writes name the tables.

One home for which column lives where, the join that reads an attempt whole, and the
statements that write the frozen half.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from db import row_sets
from db.records import Conn

FROZEN: Final = "connector_push_attempt_frozen"
# The columns of the frozen half, as the view gives them (attempt_id aside).
FROZEN_COLUMNS: Final = frozenset(
    {
        "action_type",
        "connector_namespace",
        "flow_developer_name",
        "flow_action_name",
        "flow_version",
        "target_object",
        "profile_name",
        "pack_install_id",
        "request_idempotency_key",
        "request_snapshot",
        "action_snapshot",
        "authority_snapshot",
        "writeback_snapshot",
        "values_erased_at",
    }
)
# `SELECT *` over this is the attempt whole, as one row was before the split.
WHOLE: Final = f"connector_push_attempt JOIN {FROZEN} USING (attempt_id)"

# The request as stored: without its profile, which `profile_digest` names; the
# snapshots themselves are inserted by `_SNAPSHOTS` in the same statement.
_STORED_REQUEST: Final = """CASE WHEN jsonb_typeof({r} -> 'profile') = 'object'
                 THEN {r} - 'profile' ELSE {r} END"""
_SNAPSHOTS: Final = """
snapshots AS (
    INSERT INTO connector_frozen_snapshot (digest, snapshot)
    SELECT DISTINCT connector_snapshot_digest(s.snapshot), s.snapshot
    FROM frozen, LATERAL (VALUES ((frozen.f).request_snapshot -> 'profile'),
                                 ((frozen.f).action_snapshot)) AS s (snapshot)
    WHERE jsonb_typeof(s.snapshot) = 'object'
    ON CONFLICT DO NOTHING
)"""

_INSERT: Final = """
WITH given AS (
    SELECT $1::jsonb || e AS j FROM jsonb_array_elements($2::jsonb) AS e
), frozen AS (
    SELECT jsonb_populate_record(NULL::connector_push_attempt, j) AS a,
           jsonb_populate_record(NULL::connector_push_attempt_frozen, j) AS f
    FROM given
), {snapshots}, state AS (
    INSERT INTO connector_push_attempt ({state})
    SELECT {state_values} FROM frozen
)
INSERT INTO connector_push_attempt_request
    (attempt_id, {request}, request_snapshot, profile_digest, action_digest)
SELECT (a).attempt_id, {request_values}, {stored_request},
       connector_snapshot_digest((f).request_snapshot -> 'profile'),
       connector_snapshot_digest((f).action_snapshot)
FROM frozen
"""


async def insert_attempts(conn: Conn, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `pending` attempts, both rows of each, in one statement; every row names the
    same columns (attempt_id and request_snapshot among them). Columns the rows leave out
    take their defaults; a guard that refuses one row refuses the statement."""
    if not rows:
        return
    shared, own = row_sets.split_shared(rows)
    columns = list(rows[0])
    assert "attempt_id" in columns and "request_snapshot" in columns
    assert all(c.isidentifier() for c in columns), "names from code"
    state = [c for c in columns if c not in FROZEN_COLUMNS]
    request = [c for c in columns if c in FROZEN_COLUMNS - {"request_snapshot", "action_snapshot"}]
    sql = _INSERT.format(
        snapshots=_SNAPSHOTS.strip(),
        state=", ".join(state),
        state_values=", ".join(f"(a).{c}" for c in state),
        request=", ".join(request),
        request_values=", ".join(f"(f).{c}" for c in request),
        stored_request=_STORED_REQUEST.format(r="(f).request_snapshot"),
    )
    await conn.execute(sql, row_sets.to_json(shared), row_sets.to_json(own))


# LANE-2: the association-complete body, frozen under this claim before the first POST.
FREEZE_COMPLETED: Final = f"""
WITH snapshots AS (
    INSERT INTO connector_frozen_snapshot (digest, snapshot)
    SELECT connector_snapshot_digest($3::jsonb -> 'profile'), $3::jsonb -> 'profile'
    WHERE jsonb_typeof($3::jsonb -> 'profile') = 'object'
    ON CONFLICT DO NOTHING
)
UPDATE connector_push_attempt_request r
SET request_snapshot = {_STORED_REQUEST.format(r="$3::jsonb")},
    profile_digest = connector_snapshot_digest($3::jsonb -> 'profile')
FROM connector_push_attempt a
WHERE r.attempt_id = $1 AND a.attempt_id = $1 AND a.claim_token = $2
  AND a.status = 'processing'
RETURNING 1
"""
