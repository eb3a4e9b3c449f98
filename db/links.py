"""Named queries for links and create attempts (the create path, SPEC §5).

Each function runs one statement on a connection the caller owns (and usually
holds in a transaction). Every state change is a compare-and-set: the WHERE
clause names the expected state and a zero-row result is returned as `None` or
`False`, never ignored (ARCH-2).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from db import revalidation_scope as scope_q
from db.attempt_request import FREEZE_COMPLETED, FROZEN, WHOLE
from db.records import Conn

Row = asyncpg.Record

# Lanes this runtime claims (LANE-1); any other lane value is left untouched.
CLAIMABLE_LANES = ["configured", "deferred_association"]


async def lock_link_key(conn: Conn, link_key: str) -> None:
    """Serialise admission, dispatch and operator actions of one link key (after its
    owner's scope lock, shared: db/revalidation_scope.py)."""
    await scope_q.lock_link_key(conn, link_key)


async def occupying_attempt(conn: Conn, link_key: str) -> Row | None:
    """The attempt holding the create slot (ID-5), locked for this transaction, with its
    owner's active install id (`active_pack_install_id`, null when none) read in the same
    statement: the attempt-side drift check before a POST needs it (GATE-2)."""
    return await conn.fetchrow(
        """
        SELECT *,
               (SELECT p.pack_install_id::text FROM pack_install p
                WHERE p.connector_owner_key = a.connector_owner_key AND p.active)
                   AS active_pack_install_id
        FROM connector_push_attempt a JOIN connector_push_attempt_frozen USING (attempt_id)
        WHERE a.link_key = $1 AND a.status NOT IN ('finalized', 'superseded')
        FOR UPDATE OF a
        """,
        link_key,
    )


async def attempt_by_id(conn: Conn, attempt_id: str) -> Row | None:
    return await conn.fetchrow(
        f"SELECT * FROM {WHOLE} WHERE attempt_id = $1 FOR UPDATE OF connector_push_attempt",
        uuid.UUID(attempt_id),
    )


async def link_by_key(conn: Conn, link_key: str) -> Row | None:
    return await conn.fetchrow(
        "SELECT * FROM connector_remote_link WHERE link_key = $1 FOR UPDATE", link_key
    )


async def attempt_statuses(conn: Conn, link_key: str) -> list[Row]:
    return await conn.fetch(
        """
        SELECT attempt_id, status, attempt_ordinal, dispatch_lane
        FROM connector_push_attempt WHERE link_key = $1 ORDER BY attempt_ordinal
        """,
        link_key,
    )


async def move_attempt(
    conn: Conn,
    attempt_id: str,
    expected: list[str],
    target: str,
    *,
    token: uuid.UUID | None = None,
    last_error: str | None = None,
    response: dict[str, Any] | None = None,
    remote_id: str | None = None,
    mirror_status: str | None = None,
) -> Row | None:
    """Compare-and-set an attempt's status (and fencing token when given); the moved row,
    whole. Only in the lanes this runtime claims (LANE-1): a row in any other lane is
    never moved, whoever asks (recovery, writeback, parking, an operator), and reads as a
    CAS miss."""
    return await conn.fetchrow(
        f"""
        WITH moved AS (
            UPDATE connector_push_attempt
            SET status = $3,
                last_error = COALESCE($5, last_error),
                response_snapshot = COALESCE($6::jsonb, response_snapshot),
                remote_id = COALESCE($7, remote_id),
                mirror_status = COALESCE($8, mirror_status)
            WHERE attempt_id = $1 AND status = ANY($2::text[])
              AND ($4::uuid IS NULL OR claim_token = $4)
              AND dispatch_lane = ANY($9::text[])
            RETURNING *
        )
        SELECT * FROM moved JOIN {FROZEN} USING (attempt_id)
        """,
        uuid.UUID(attempt_id),
        expected,
        target,
        token,
        last_error,
        json.dumps(response) if response is not None else None,
        remote_id,
        mirror_status,
        CLAIMABLE_LANES,
    )


async def record_operator(
    conn: Conn, table: str, key_column: str, key: Any, operator: str, reason: str
) -> None:
    """Stamp who/why/when on the row an operator action changed (WF-3)."""
    assert table in {"connector_push_attempt", "connector_remote_link"}
    assert key_column in {"attempt_id", "link_key"}
    await conn.execute(
        f"UPDATE {table} SET last_operator = $2, last_operator_reason = $3, "
        f"last_operator_at = now() WHERE {key_column} = $1",
        key,
        operator,
        reason,
    )


async def set_link_mirror_status(conn: Conn, link_key: str, status: str) -> None:
    await conn.execute(
        "UPDATE connector_remote_link SET mirror_status = $2 WHERE link_key = $1",
        link_key,
        status,
    )


async def insert_link(conn: Conn, values: dict[str, Any]) -> None:
    """Create the `finalized` link; the ID-4 index rejects a remote locator already owned."""
    columns = list(values)
    placeholders = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    await conn.execute(
        f"INSERT INTO connector_remote_link ({', '.join(columns)}) VALUES ({placeholders})",
        *[_param(values[c]) for c in columns],
    )


async def move_link(conn: Conn, link_key: str, expected: list[str], target: str) -> bool:
    row = await conn.fetchval(
        """
        UPDATE connector_remote_link SET status = $3
        WHERE link_key = $1 AND status = ANY($2::text[])
        RETURNING 1
        """,
        link_key,
        expected,
        target,
    )
    return row is not None


async def supersede_attempt(conn: Conn, attempt_id: str, superseded_by: str | None) -> bool:
    row = await conn.fetchval(
        """
        UPDATE connector_push_attempt SET status = 'superseded', superseded_by = $2
        WHERE attempt_id = $1 AND status = 'terminal_failed'
        RETURNING 1
        """,
        uuid.UUID(attempt_id),
        uuid.UUID(superseded_by) if superseded_by else None,
    )
    return row is not None


async def update_link_snapshot(
    conn: Conn, link_key: str, expected_status: str, values: dict[str, Any]
) -> bool:
    """Compare-and-set on the link's status, writing `values` (column -> value)."""
    columns = list(values)
    assert all(column.isidentifier() for column in columns), "columns come from code"
    assignments = ", ".join(f"{c} = ${i}" for i, c in enumerate(columns, start=3))
    row = await conn.fetchval(
        f"UPDATE connector_remote_link SET {assignments} "
        "WHERE link_key = $1 AND status = $2 RETURNING 1",
        link_key,
        expected_status,
        *[_param(values[c]) for c in columns],
    )
    return row is not None


def _param(value: Any) -> Any:
    """jsonb columns take JSON text; everything else passes through."""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


async def record_attempt_drift(conn: Conn, attempt_id: str, findings: list[dict[str, Any]]) -> None:
    """GATE-2: the drift findings of the attempt's frozen snapshot, as last classified."""
    await conn.execute(
        "UPDATE connector_push_attempt SET drift_findings = $2::jsonb WHERE attempt_id = $1",
        uuid.UUID(attempt_id),
        json.dumps(findings),
    )


async def freeze_completed_request(
    conn: Conn, attempt_id: str, token: uuid.UUID, request: dict[str, Any]
) -> bool:
    """LANE-2: the association-complete body, frozen under this claim before the first POST."""
    row = await conn.fetchval(
        FREEZE_COMPLETED,
        uuid.UUID(attempt_id),
        token,
        json.dumps(request),
    )
    return row is not None


async def link_targets(conn: Conn, link_keys: list[str]) -> dict[str, Row]:
    rows = await conn.fetch(
        "SELECT link_key, status, remote_id FROM connector_remote_link WHERE link_key = ANY($1)",
        link_keys,
    )
    return {r["link_key"]: r for r in rows}


async def deferred_dependants(conn: Conn, owner_key: str, source_record_id: str) -> list[str]:
    """Link keys of deferred attempts whose frozen vector names this record (LANE-2 wake-up)."""
    rows = await conn.fetch(
        """
        SELECT link_key FROM connector_push_attempt
        WHERE connector_owner_key = $1 AND dispatch_lane = 'deferred_association'
          AND status = 'pending' AND association_source_ids @> jsonb_build_array($2::text)
        """,
        owner_key,
        source_record_id,
    )
    return [r["link_key"] for r in rows]


async def view_rows(conn: Conn, link_key: str) -> Row:
    """In one round trip: the link, its newest attempt, queued PATCHes, the last PATCH and
    how many tries of the newest attempt and PATCH may have landed (JRN-1)."""
    row = await conn.fetchrow(
        """
        SELECT
          (SELECT row_to_json(l) FROM (
             SELECT status, remote_id, connector_owner_key, destination_slot_id, source_object,
                    source_record_id, suspend_reason
             FROM connector_remote_link WHERE link_key = $1) l) AS link,
          (SELECT row_to_json(a) FROM (
             SELECT attempt_id, status, attempt_ordinal, dispatch_lane, last_error, remote_id,
                    connector_owner_key, destination_slot_id, source_object, source_record_id
             FROM connector_push_attempt WHERE link_key = $1
             ORDER BY attempt_ordinal DESC LIMIT 1) a) AS attempt,
          ARRAY(SELECT status FROM connector_patch_dispatch
                WHERE link_key = $1 AND status IN ('pending', 'processing')
                ORDER BY created_at) AS pending_patches,
          (SELECT status FROM connector_patch_dispatch
           WHERE link_key = $1 AND status NOT IN ('pending', 'superseded')
           ORDER BY updated_at DESC LIMIT 1) AS last_patch,
          (SELECT count(*) FROM connector_send_journal j
           WHERE j.attempt_id = (SELECT attempt_id FROM connector_push_attempt
                                 WHERE link_key = $1 ORDER BY attempt_ordinal DESC LIMIT 1)
             AND j.kind = 'send'
             AND send_try_may_have_landed('create', j.outcome, j.status,
                                          j.not_applied_statuses)) AS attempt_landed,
          (SELECT count(*) FROM connector_send_journal j
           WHERE j.patch_id = (SELECT patch_id FROM connector_patch_dispatch
                               WHERE link_key = $1 AND status <> 'pending'
                               ORDER BY created_at DESC LIMIT 1)
             AND j.kind = 'send'
             AND send_try_may_have_landed('patch', j.outcome, j.status,
                                          j.not_applied_statuses)) AS patch_landed
        """,
        link_key,
    )
    assert row is not None
    return row


async def lineage_rows(
    conn: Conn, owner_key: str, slots: list[str], source_object: str, record_id: str
) -> list[Row]:
    """This record's links and attempts under the given (predecessor) action slots (ID-6)."""
    return await conn.fetch(
        """
        SELECT action_slot_id AS slot_id, status AS link_status, NULL AS attempt_status
        FROM connector_remote_link
        WHERE connector_owner_key = $1 AND action_slot_id = ANY($2::text[])
          AND source_object = $3 AND source_record_id = $4
        UNION ALL
        SELECT action_slot_id, NULL, status
        FROM connector_push_attempt
        WHERE connector_owner_key = $1 AND action_slot_id = ANY($2::text[])
          AND source_object = $3 AND source_record_id = $4
        """,
        owner_key,
        slots,
        source_object,
        record_id,
    )


async def set_superseded_by(conn: Conn, attempt_id: str, successor: uuid.UUID) -> None:
    await conn.execute(
        "UPDATE connector_push_attempt SET superseded_by = $2 WHERE attempt_id = $1",
        uuid.UUID(attempt_id),
        successor,
    )


async def locator_owner(
    conn: Conn, owner_key: str, destination_slot_id: str, remote_scope: str, remote_id: str
) -> str | None:
    """The non-retired link that owns this remote locator (ID-4), if any."""
    owner: str | None = await conn.fetchval(
        """
        SELECT link_key FROM connector_remote_link
        WHERE connector_owner_key = $1 AND destination_slot_id = $2 AND remote_scope = $3
          AND remote_id = $4 AND status <> 'retired'
        """,
        owner_key,
        destination_slot_id,
        remote_scope,
        remote_id,
    )
    return owner


# -- pack apply --dry-run (C-4): what a new install would do, page by page --------------


async def owner_finalized_links_page(
    conn: Conn, owner_key: str, after_key: str, limit: int
) -> list[Row]:
    """The owner's finalized links after `after_key` in link-key order (unlocked)."""
    return await conn.fetch(
        """
        SELECT * FROM connector_remote_link
        WHERE connector_owner_key = $1 AND status = 'finalized' AND link_key COLLATE "C" > $2
        ORDER BY link_key COLLATE "C" LIMIT $3
        """,
        owner_key,
        after_key,
        limit,
    )


async def owner_active_attempts_page(
    conn: Conn, owner_key: str, after_key: str, limit: int
) -> list[Row]:
    """The owner's attempts that are not released or terminal, after `after_key` (unlocked)."""
    return await conn.fetch(
        """
        SELECT * FROM connector_push_attempt JOIN connector_push_attempt_frozen USING (attempt_id)
        WHERE connector_owner_key = $1
          AND status NOT IN ('finalized', 'superseded', 'terminal_failed')
          AND link_key COLLATE "C" > $2
        ORDER BY link_key COLLATE "C" LIMIT $3
        """,
        owner_key,
        after_key,
        limit,
    )
