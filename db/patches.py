"""Named queries for PATCH dispatches and link suspension (SPEC §5.5, PAT, DRIFT-2).

One statement per function, compare-and-set on the expected status, zero rows
returned as `None`/`False` (ARCH-2). The caller owns the transaction.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from asyncpg import Record
from pydantic import JsonValue

from db.records import Conn
from protocol.states import PatchStatus, check_patch_transition


@dataclass(frozen=True, slots=True)
class PatchRow:
    """A PATCH dispatch as its steps read it, JSON columns decoded (None: not set; the
    body, path and snapshots are frozen under the claim, so a queued PATCH has none)."""

    patch_id: uuid.UUID
    link_key: str
    status: PatchStatus
    originating_user_id: str | None
    remote_io_started_at: datetime | None
    update_path: str | None
    body: JsonValue
    authority_snapshot: dict[str, JsonValue] | None
    profile_snapshot: dict[str, JsonValue] | None


@dataclass(frozen=True, slots=True)
class FrozenPatch:
    """What a claimed PATCH will send, frozen under its claim (built from the latest record)."""

    body: JsonValue
    body_fingerprint: str
    update_path: str
    authority_snapshot: dict[str, JsonValue]
    profile_snapshot: dict[str, JsonValue]


_PATCH_COLUMNS: Final = """
patch_id, link_key, status, originating_user_id, remote_io_started_at, update_path, body,
authority_snapshot, profile_snapshot
"""

SELECT_PENDING: Final = f"""
SELECT {_PATCH_COLUMNS} FROM connector_patch_dispatch
WHERE link_key = $1 AND status = 'pending' AND dispatch_lane = 'configured'
FOR UPDATE
"""

SELECT_IN_FLIGHT: Final = f"""
SELECT {_PATCH_COLUMNS} FROM connector_patch_dispatch
WHERE link_key = $1 AND status = 'processing' AND dispatch_lane = 'configured'
ORDER BY created_at LIMIT 1 FOR UPDATE
"""

SELECT_BY_ID: Final = f"""
SELECT {_PATCH_COLUMNS} FROM connector_patch_dispatch WHERE patch_id = $1 FOR UPDATE
"""


def _decoded(text: str | None) -> Any:
    """asyncpg hands jsonb over as its text."""
    return None if text is None else json.loads(text)


def _patch(row: Record | None) -> PatchRow | None:
    if row is None:
        return None
    return PatchRow(
        patch_id=row["patch_id"],
        link_key=row["link_key"],
        status=PatchStatus(row["status"]),
        originating_user_id=row["originating_user_id"],
        remote_io_started_at=row["remote_io_started_at"],
        update_path=row["update_path"],
        body=_decoded(row["body"]),
        authority_snapshot=_decoded(row["authority_snapshot"]),
        profile_snapshot=_decoded(row["profile_snapshot"]),
    )


async def pending_patch(conn: Conn, link_key: str) -> PatchRow | None:
    """The link's queued PATCH, locked."""
    return _patch(await conn.fetchrow(SELECT_PENDING, link_key))


async def in_flight_patch(conn: Conn, link_key: str) -> PatchRow | None:
    """A PATCH left `processing` by an earlier try (crash, timeout, retry), locked."""
    return _patch(await conn.fetchrow(SELECT_IN_FLIGHT, link_key))


async def release_lost_patch(conn: Conn, patch_id: uuid.UUID) -> PatchStatus | None:
    """A `processing` PATCH whose claim was lost before any remote I/O (its worker died or
    outlived its timeout; the checkpoint is null): back to `pending` with its retry count
    advanced (PAT, seed "Deferred Association Dispatch Lane"); or, when a newer save has
    queued one meanwhile (one pending per link), `failed` with the reason, so the queued
    PATCH, built from the latest record, goes instead. Nothing was sent. The new status."""
    status: str | None = await conn.fetchval(
        """
        UPDATE connector_patch_dispatch p
        SET status = CASE WHEN queued.patch_id IS NULL THEN 'pending' ELSE 'failed' END,
            last_error = CASE WHEN queued.patch_id IS NULL THEN p.last_error
                              ELSE 'claim lost before any remote I/O; a newer queued PATCH '
                                   || 'carries the latest state' END,
            claim_token = NULL, claimed_at = NULL, retry_count = p.retry_count + 1
        FROM (SELECT $1::uuid AS id) AS me
        LEFT JOIN LATERAL (
            SELECT q.patch_id FROM connector_patch_dispatch q, connector_patch_dispatch mine
            WHERE mine.patch_id = me.id AND q.link_key = mine.link_key AND q.status = 'pending'
            LIMIT 1
        ) AS queued ON true
        WHERE p.patch_id = me.id AND p.status = 'processing' AND p.remote_io_started_at IS NULL
          AND p.dispatch_lane = 'configured'
        RETURNING p.status
        """,
        patch_id,
    )
    return None if status is None else PatchStatus(status)


async def queue_patch(conn: Conn, link_key: str, user_id: str | None) -> str:
    """PATCH-2: coalesce into the queued PATCH (latest saver wins) or queue a new one."""
    patch_id = await conn.fetchval(
        """
        INSERT INTO connector_patch_dispatch (link_key, status, originating_user_id)
        VALUES ($1, 'pending', $2)
        ON CONFLICT (link_key) WHERE status = 'pending'
        DO UPDATE SET originating_user_id = EXCLUDED.originating_user_id
        RETURNING patch_id
        """,
        link_key,
        user_id,
    )
    return str(patch_id)


async def claim_patch(conn: Conn, patch_id: uuid.UUID, token: uuid.UUID) -> bool:
    row = await conn.fetchval(
        """
        UPDATE connector_patch_dispatch
        SET status = 'processing', claim_token = $2, claimed_at = now()
        WHERE patch_id = $1 AND status IN ('pending', 'processing')
          AND remote_io_started_at IS NULL
        RETURNING 1
        """,
        patch_id,
        token,
    )
    return row is not None


async def freeze_patch(
    conn: Conn, patch_id: uuid.UUID, token: uuid.UUID, frozen: FrozenPatch
) -> bool:
    """Store the body, path and authority the PATCH will send (built from the latest record)."""
    row = await conn.fetchval(
        """
        UPDATE connector_patch_dispatch
        SET body = $3::jsonb, body_fingerprint = $4, update_path = $5,
            authority_snapshot = $6::jsonb, profile_snapshot = $7::jsonb
        WHERE patch_id = $1 AND claim_token = $2 AND status = 'processing'
        RETURNING 1
        """,
        patch_id,
        token,
        json.dumps(frozen.body),
        frozen.body_fingerprint,
        frozen.update_path,
        json.dumps(frozen.authority_snapshot),
        json.dumps(frozen.profile_snapshot),
    )
    return row is not None


async def finish_patch(
    conn: Conn,
    patch_id: uuid.UUID,
    target: PatchStatus,
    *,
    token: uuid.UUID | None = None,
    last_error: str | None = None,
    response: dict[str, Any] | None = None,
) -> bool:
    """processing -> succeeded | failed | ambiguous_remote_effect (CAS on the claim). A
    target the PAT table does not allow from `processing` raises `ProtocolError` before
    any statement (the table the status trigger is generated from)."""
    check_patch_transition(PatchStatus.PROCESSING, target)
    row = await conn.fetchval(
        """
        UPDATE connector_patch_dispatch
        SET status = $2, last_error = COALESCE($4, last_error),
            response_snapshot = COALESCE($5::jsonb, response_snapshot)
        WHERE patch_id = $1 AND status = 'processing' AND ($3::uuid IS NULL OR claim_token = $3)
        RETURNING 1
        """,
        patch_id,
        target.value,
        token,
        last_error,
        json.dumps(response) if response is not None else None,
    )
    return row is not None


async def supersede_queued(conn: Conn, link_key: str, reason: str) -> None:
    """A suspended or retired link sends nothing: queued PATCHes are closed as superseded."""
    await conn.execute(
        """
        UPDATE connector_patch_dispatch SET status = 'superseded', last_error = $2
        WHERE link_key = $1 AND status = 'pending'
        """,
        link_key,
        reason,
    )


async def suspend_link(
    conn: Conn, link_key: str, reason: str, findings: list[dict[str, Any]], *, wake: bool = False
) -> bool:
    """finalized -> suspended_drift with the reason and findings recorded (DRIFT-2, PATCH-3).

    `wake`: the suspension is made outside the link's workflow (a save's admission), so
    the relay must wake the workflow once to list it for an operator (WF-2, migration
    0290) should the caller's own best-effort wake-up not happen; a suspension made by
    the workflow's own step needs none."""
    row = await conn.fetchval(
        """
        UPDATE connector_remote_link
        SET status = 'suspended_drift', suspend_reason = $2, drift_findings = $3::jsonb,
            wake_pending = wake_pending OR $4
        WHERE link_key = $1 AND status = 'finalized'
        RETURNING 1
        """,
        link_key,
        reason,
        json.dumps(findings),
        wake,
    )
    return row is not None


async def set_remote_etag(conn: Conn, link_key: str, etag: str | None) -> None:
    """The link's entity tag: a PATCH's answer, or an operator's read-back (None: the
    remote gave none, and the old one no longer stands)."""
    await conn.execute(
        "UPDATE connector_remote_link SET remote_etag = $2 WHERE link_key = $1", link_key, etag
    )


async def patch_by_id(conn: Conn, patch_id: uuid.UUID) -> PatchRow | None:
    """One PATCH, locked."""
    return _patch(await conn.fetchrow(SELECT_BY_ID, patch_id))


async def queue_patches(conn: Conn, users_by_key: dict[str, str | None]) -> None:
    """`queue_patch` for many links in one statement (one entry per link key: a batch's
    latest saver for the key, as `queue_patch` one by one would have left it)."""
    await conn.execute(
        """
        INSERT INTO connector_patch_dispatch (link_key, status, originating_user_id)
        SELECT link_key, 'pending', user_id
        FROM unnest($1::text[], $2::text[]) AS t(link_key, user_id)
        ON CONFLICT (link_key) WHERE status = 'pending'
        DO UPDATE SET originating_user_id = EXCLUDED.originating_user_id
        """,
        list(users_by_key),
        list(users_by_key.values()),
    )


async def ambiguous_bodies_since_etag(conn: Conn, link_key: str) -> list[JsonValue]:
    """Bodies of the link's PATCHes that ended ambiguous after its last succeeded one (the
    last time the entity tag was stored), newest first (PROF-2)."""
    rows = await conn.fetch(
        """
        SELECT body FROM connector_patch_dispatch
        WHERE link_key = $1 AND status = 'ambiguous_remote_effect' AND body IS NOT NULL
          AND created_at > COALESCE(
              (SELECT max(created_at) FROM connector_patch_dispatch
               WHERE link_key = $1 AND status = 'succeeded'), '-infinity')
        ORDER BY created_at DESC LIMIT 10
        """,
        link_key,
    )
    return [_decoded(r["body"]) for r in rows]
