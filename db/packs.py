"""Named queries for pack installs and slot lineage (SPEC PACK-1, ID-3, ID-6).

Each function runs one statement; the caller owns the transaction (STYLE rule 7).
Manifests travel as JSON text and are stored as `jsonb`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from asyncpg import Record
from pydantic import JsonValue

from db.records import Conn
from protocol.drift import DriftSurface
from protocol.manifest import LineageKind


@dataclass(frozen=True)
class PackInstallRow:
    pack_install_id: str
    connector_owner_key: str
    connector_namespace: str
    manifest: dict[str, JsonValue]
    manifest_digest: str
    active: bool
    created_at: datetime
    activated_at: datetime | None
    deactivated_at: datetime | None
    # C-8: the owner's action slots whose changed createPath awaits validation (read with
    # the active install only; empty otherwise).
    create_blocked: tuple[str, ...] = ()


@dataclass(frozen=True)
class LineageRow:
    pack_install_id: str
    slot_type: str  # 'action' | 'destination'
    kind: LineageKind
    from_slot: str
    to_slot: str | None


_INSTALL_COLUMNS: Final = """
pack_install_id::text AS pack_install_id, connector_owner_key, connector_namespace,
manifest::text AS manifest, manifest_digest, active, created_at, activated_at, deactivated_at
"""

# Serialises applies per owner key, so two concurrent applies of one pack cannot
# both decide "changed" from the same active row.
# The apply lock's key for owner key $1 (`lock_owner_key`; db.slot_guard shares it).


def owner_apply_lock_key(owner_sql: str) -> str:
    """The apply lock's advisory key for the owner-key SQL expression given."""
    return f"hashtextextended('pack_install:' || {owner_sql}, 0)"


OWNER_APPLY_KEY: Final = owner_apply_lock_key("$1")
LOCK_OWNER_KEY: Final = f"SELECT pg_advisory_xact_lock({OWNER_APPLY_KEY})"

# With the slots whose createPath change awaits validation (C-8), in the same statement:
# admission reads the active install once per batch and owner, and this rides along.
SELECT_ACTIVE_INSTALL: Final = f"""
SELECT {_INSTALL_COLUMNS},
    ARRAY(SELECT c.action_slot_id FROM action_slot_create_path c
          WHERE c.connector_owner_key = $1 AND c.validated_at IS NULL
          ORDER BY c.action_slot_id) AS create_blocked
FROM pack_install WHERE connector_owner_key = $1 AND active
"""

SELECT_INSTALL: Final = f"""
SELECT {_INSTALL_COLUMNS} FROM pack_install WHERE pack_install_id = $1::uuid
"""

SELECT_INSTALLS: Final = f"""
SELECT {_INSTALL_COLUMNS} FROM pack_install
WHERE $1::text IS NULL OR connector_owner_key = $1
ORDER BY connector_owner_key, created_at, pack_install_id
"""

SELECT_ACTIVE_OWNER_KEYS: Final = """
SELECT connector_owner_key FROM pack_install WHERE active ORDER BY connector_owner_key
"""

DEACTIVATE_INSTALL: Final = """
UPDATE pack_install SET active = false, deactivated_at = now()
WHERE pack_install_id = $1::uuid AND active
"""

INSERT_ACTIVE_INSTALL: Final = f"""
INSERT INTO pack_install
    (connector_owner_key, connector_namespace, manifest, manifest_digest, active, activated_at,
     previous_pack_install_id)
VALUES ($1, $2, $3::jsonb, $4, true, now(), $5::uuid)
RETURNING {_INSTALL_COLUMNS}
"""

SELECT_INSTALL_ANCESTORS: Final = """
WITH RECURSIVE chain AS (
    SELECT previous_pack_install_id AS id FROM pack_install WHERE pack_install_id = $1::uuid
    UNION
    SELECT p.previous_pack_install_id FROM pack_install p JOIN chain c ON p.pack_install_id = c.id
)
SELECT id::text AS id FROM chain WHERE id IS NOT NULL
"""

INSERT_LINEAGE: Final = """
INSERT INTO pack_slot_lineage (pack_install_id, slot_type, kind, from_slot, to_slot)
SELECT $1::uuid, * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[])
"""

SELECT_LINEAGE: Final = """
SELECT pack_install_id::text AS pack_install_id, slot_type, kind, from_slot, to_slot
FROM pack_slot_lineage WHERE pack_install_id = $1::uuid
ORDER BY slot_type, from_slot
"""

# ID-6: every slot rebound, directly or through a chain, into `$3` under the
# owner's active install, with its own lineage row.
SELECT_ACTIVE_PREDECESSORS: Final = """
WITH RECURSIVE active AS (
    SELECT pack_install_id FROM pack_install WHERE connector_owner_key = $1 AND active
), chain AS (
    SELECT l.pack_install_id, l.slot_type, l.kind, l.from_slot, l.to_slot
    FROM pack_slot_lineage l JOIN active USING (pack_install_id)
    WHERE l.slot_type = $2 AND l.to_slot = $3
    UNION
    SELECT l.pack_install_id, l.slot_type, l.kind, l.from_slot, l.to_slot
    FROM pack_slot_lineage l JOIN chain c
      ON l.pack_install_id = c.pack_install_id AND l.slot_type = c.slot_type
     AND l.to_slot = c.from_slot
)
SELECT pack_install_id::text AS pack_install_id, slot_type, kind, from_slot, to_slot
FROM chain ORDER BY from_slot
"""


def _install(row: Record) -> PackInstallRow:
    manifest = json.loads(row["manifest"])
    assert isinstance(manifest, dict)
    return PackInstallRow(
        pack_install_id=row["pack_install_id"],
        connector_owner_key=row["connector_owner_key"],
        connector_namespace=row["connector_namespace"],
        manifest=manifest,
        manifest_digest=row["manifest_digest"],
        active=row["active"],
        created_at=row["created_at"],
        activated_at=row["activated_at"],
        deactivated_at=row["deactivated_at"],
        create_blocked=tuple(row.get("create_blocked") or ()),
    )


def _lineage(row: Record) -> LineageRow:
    return LineageRow(
        pack_install_id=row["pack_install_id"],
        slot_type=row["slot_type"],
        kind=LineageKind(row["kind"]),
        from_slot=row["from_slot"],
        to_slot=row["to_slot"],
    )


async def lock_owner_key(conn: Conn, owner_key: str) -> None:
    """Take the transaction-scoped apply lock for one `ConnectorOwnerKey`."""
    await conn.execute(LOCK_OWNER_KEY, owner_key)


async def select_active_install(conn: Conn, owner_key: str) -> PackInstallRow | None:
    row = await conn.fetchrow(SELECT_ACTIVE_INSTALL, owner_key)
    return None if row is None else _install(row)


async def select_install(conn: Conn, pack_install_id: str) -> PackInstallRow | None:
    row = await conn.fetchrow(SELECT_INSTALL, pack_install_id)
    return None if row is None else _install(row)


async def select_installs(conn: Conn, owner_key: str | None = None) -> list[PackInstallRow]:
    """Every install incarnation, oldest first per owner key; all owners when None."""
    return [_install(row) for row in await conn.fetch(SELECT_INSTALLS, owner_key)]


async def select_active_owner_keys(conn: Conn) -> list[str]:
    return [str(row["connector_owner_key"]) for row in await conn.fetch(SELECT_ACTIVE_OWNER_KEYS)]


async def deactivate_install(conn: Conn, pack_install_id: str) -> bool:
    """Compare-and-set active → inactive; False when it was not active (a conflict)."""
    status = await conn.execute(DEACTIVATE_INSTALL, pack_install_id)
    return status == "UPDATE 1"


async def insert_active_install(
    conn: Conn,
    owner_key: str,
    namespace: str,
    manifest_json: str,
    manifest_digest: str,
    previous_pack_install_id: str | None = None,
) -> PackInstallRow:
    row = await conn.fetchrow(
        INSERT_ACTIVE_INSTALL,
        owner_key,
        namespace,
        manifest_json,
        manifest_digest,
        previous_pack_install_id,
    )
    assert row is not None
    return _install(row)


async def insert_lineage(conn: Conn, pack_install_id: str, rows: Sequence[LineageRow]) -> None:
    await conn.execute(
        INSERT_LINEAGE,
        pack_install_id,
        [r.slot_type for r in rows],
        [r.kind.value for r in rows],
        [r.from_slot for r in rows],
        [r.to_slot for r in rows],
    )


async def select_lineage(conn: Conn, pack_install_id: str) -> list[LineageRow]:
    return [_lineage(row) for row in await conn.fetch(SELECT_LINEAGE, pack_install_id)]


async def select_active_predecessors(
    conn: Conn, owner_key: str, slot_id: str, slot_type: str = "action"
) -> list[LineageRow]:
    """Lineage rows of the owner's active install that lead, transitively, into `slot_id`."""
    rows = await conn.fetch(SELECT_ACTIVE_PREDECESSORS, owner_key, slot_type, slot_id)
    return [_lineage(row) for row in rows]


async def select_install_ancestors(conn: Conn, pack_install_id: str) -> list[str]:
    """Installs this one upgraded, transitively (not across a reinstall)."""
    return [row["id"] for row in await conn.fetch(SELECT_INSTALL_ANCESTORS, pack_install_id)]


# -- install changes fail closed (C-4, C-8, C-9) -------------------------------------------

# C-9: the owner's finalized links whose action slot the new install no longer has become
# `suspended_drift` in the apply's transaction, rows locked in link-key order; their queued
# PATCHes are closed as for any suspension (db/patches.py `supersede_queued`).
SUSPEND_REMOVED_SLOT_LINKS: Final = """
WITH target AS (
    SELECT link_key FROM connector_remote_link
    WHERE connector_owner_key = $1 AND status = 'finalized'
      AND NOT (action_slot_id = ANY($2::text[]))
    ORDER BY link_key COLLATE "C" FOR UPDATE
), gone AS (
    UPDATE connector_remote_link l
    SET status = 'suspended_drift', suspend_reason = $3, wake_pending = true,
        drift_findings = jsonb_build_array(jsonb_build_object(
            'surface', $4::text, 'disposition', 'fail_closed',
            'detail', 'action slot ' || quote_literal(l.action_slot_id)
                      || ' is not in install ' || $5::text))
    FROM target WHERE l.link_key = target.link_key AND l.status = 'finalized'
    RETURNING l.link_key
), closed AS (
    UPDATE connector_patch_dispatch SET status = 'superseded', last_error = $6
    WHERE status = 'pending' AND link_key IN (SELECT link_key FROM gone)
)
SELECT link_key FROM gone ORDER BY link_key COLLATE "C"
"""

# C-4: links that wait for an explicit revalidation against `$2`: finalized but validated
# under another install, or already suspended because of the install change.
COUNT_AWAITING_REVALIDATION: Final = """
SELECT count(*) FILTER (WHERE status = 'finalized') AS finalized,
       count(*) FILTER (WHERE status = 'suspended_drift') AS suspended
FROM connector_remote_link
WHERE connector_owner_key = $1
  AND ((status = 'finalized' AND last_validated_pack_install_id <> $2::uuid)
       OR (status = 'suspended_drift' AND suspend_reason = ANY($3::text[])))
"""

UPSERT_CREATE_PATH_CHANGES: Final = """
INSERT INTO action_slot_create_path
    (connector_owner_key, action_slot_id, create_path_template, previous_create_path,
     pack_install_id)
SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[]), (SELECT $5::uuid) AS i
ON CONFLICT (connector_owner_key, action_slot_id) DO UPDATE
SET create_path_template = excluded.create_path_template,
    previous_create_path = excluded.previous_create_path,
    pack_install_id = excluded.pack_install_id, changed_at = now(),
    validated_by = NULL, validated_reason = NULL, validated_at = NULL
"""

VALIDATE_CREATE_PATHS: Final = """
UPDATE action_slot_create_path
SET validated_by = $3, validated_reason = $4, validated_at = now()
WHERE connector_owner_key = $1 AND validated_at IS NULL
  AND ($2::text[] IS NULL OR action_slot_id = ANY($2::text[]))
RETURNING action_slot_id, create_path_template, previous_create_path,
          pack_install_id::text AS pack_install_id
"""

SELECT_CREATE_PATH_BLOCKS: Final = """
SELECT action_slot_id, create_path_template, previous_create_path,
       pack_install_id::text AS pack_install_id
FROM action_slot_create_path
WHERE connector_owner_key = $1 AND validated_at IS NULL ORDER BY action_slot_id
"""


@dataclass(frozen=True)
class CreatePathBlock:
    action_slot_id: str
    create_path_template: str
    previous_create_path: str
    pack_install_id: str


def _block(row: Record) -> CreatePathBlock:
    return CreatePathBlock(
        action_slot_id=row["action_slot_id"],
        create_path_template=row["create_path_template"],
        previous_create_path=row["previous_create_path"],
        pack_install_id=row["pack_install_id"],
    )


async def suspend_removed_slot_links(
    conn: Conn,
    owner_key: str,
    kept_action_slots: Sequence[str],
    reason: str,
    surface: DriftSurface,
    pack_install_id: str,
) -> list[str]:
    """C-9: suspend the owner's finalized links under any other action slot; their keys."""
    rows = await conn.fetch(
        SUSPEND_REMOVED_SLOT_LINKS,
        owner_key,
        list(kept_action_slots),
        reason,
        surface.value,
        pack_install_id,
        f"link suspended: {reason}",
    )
    return [row["link_key"] for row in rows]


async def count_awaiting_revalidation(
    conn: Conn, owner_key: str, pack_install_id: str, suspend_reasons: Sequence[str]
) -> tuple[int, int]:
    """(finalized, suspended) links of the owner that wait for revalidation (C-4)."""
    row = await conn.fetchrow(
        COUNT_AWAITING_REVALIDATION, owner_key, pack_install_id, list(suspend_reasons)
    )
    assert row is not None  # an aggregate returns its one row
    return int(row["finalized"]), int(row["suspended"])


async def record_create_path_changes(
    conn: Conn, owner_key: str, changes: Sequence[tuple[str, str, str]], pack_install_id: str
) -> None:
    """C-8: (action slot, new createPath, previous createPath) awaiting validation."""
    await conn.execute(
        UPSERT_CREATE_PATH_CHANGES,
        owner_key,
        [c[0] for c in changes],
        [c[1] for c in changes],
        [c[2] for c in changes],
        pack_install_id,
    )


async def validate_create_paths(
    conn: Conn, owner_key: str, action_slots: Sequence[str] | None, who: str, reason: str
) -> list[CreatePathBlock]:
    """C-8: mark the owner's pending createPath changes validated (all when None)."""
    slots = None if action_slots is None else list(action_slots)
    rows = await conn.fetch(VALIDATE_CREATE_PATHS, owner_key, slots, who, reason)
    return sorted((_block(row) for row in rows), key=lambda b: b.action_slot_id)


async def create_path_blocks(conn: Conn, owner_key: str) -> list[CreatePathBlock]:
    """C-8: the owner's createPath changes that still block creates."""
    return [_block(row) for row in await conn.fetch(SELECT_CREATE_PATH_BLOCKS, owner_key)]
