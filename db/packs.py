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


@dataclass(frozen=True)
class LineageRow:
    pack_install_id: str
    slot_type: str  # 'action' | 'destination'
    kind: str  # 'rebind' | 'retire'
    from_slot: str
    to_slot: str | None


_INSTALL_COLUMNS: Final = """
pack_install_id::text AS pack_install_id, connector_owner_key, connector_namespace,
manifest::text AS manifest, manifest_digest, active, created_at, activated_at, deactivated_at
"""

# Serialises applies per owner key, so two concurrent applies of one pack cannot
# both decide "changed" from the same active row.
LOCK_OWNER_KEY: Final = "SELECT pg_advisory_xact_lock(hashtextextended('pack_install:' || $1, 0))"

SELECT_ACTIVE_INSTALL: Final = f"""
SELECT {_INSTALL_COLUMNS} FROM pack_install WHERE connector_owner_key = $1 AND active
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
    )


def _lineage(row: Record) -> LineageRow:
    return LineageRow(
        pack_install_id=row["pack_install_id"],
        slot_type=row["slot_type"],
        kind=row["kind"],
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
        [r.kind for r in rows],
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
