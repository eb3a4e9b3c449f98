"""Named queries for the local record store (SPEC PACK-3): `crm_record` and the
read-permission tables. Each function runs one statement; the caller owns the
transaction (STYLE rule 7). JSON travels as text and is cast in SQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeAlias

from asyncpg import Connection, Record
from asyncpg.pool import PoolConnectionProxy
from pydantic import JsonValue

# Quoted: asyncpg classes are generic only in the stubs, not at runtime.
Conn: TypeAlias = "Connection[Record] | PoolConnectionProxy[Record]"


@dataclass(frozen=True)
class CrmRecordRow:
    source_object: str
    record_id: str
    fields: dict[str, JsonValue]
    version: int
    deleted: bool
    updated_at: datetime


@dataclass(frozen=True)
class PermissionRow:
    """The three read facts for one user and record, straight from the tables."""

    object_readable: bool
    record_readable: bool
    readable_fields: frozenset[str]


SELECT_RECORD: Final = """
SELECT source_object, record_id, fields::text AS fields, version, deleted, updated_at
FROM crm_record
WHERE source_object = $1 AND record_id = $2
"""

# An absent grant row is "cannot read": authority fails closed.
SELECT_PERMISSIONS: Final = """
SELECT
    EXISTS (
        SELECT 1 FROM crm_object_permission
        WHERE user_id = $1 AND source_object = $2 AND can_read
    ) AS object_readable,
    EXISTS (
        SELECT 1 FROM crm_record_permission
        WHERE user_id = $1 AND source_object = $2 AND record_id = $3 AND can_read
    ) AS record_readable,
    ARRAY(
        SELECT field_name FROM crm_field_permission
        WHERE user_id = $1 AND source_object = $2 AND can_read
        ORDER BY field_name
    ) AS readable_fields
"""

# The batch forms (admission of many saves at once): one statement for the whole set.
SELECT_RECORDS: Final = """
SELECT r.source_object, r.record_id, r.fields::text AS fields, r.version, r.deleted, r.updated_at
FROM unnest($1::text[], $2::text[]) AS k(source_object, record_id)
JOIN crm_record r USING (source_object, record_id)
"""

SELECT_PERMISSIONS_MANY: Final = """
SELECT
    k.user_id, k.source_object, k.record_id,
    EXISTS (
        SELECT 1 FROM crm_object_permission o
        WHERE o.user_id = k.user_id AND o.source_object = k.source_object AND o.can_read
    ) AS object_readable,
    EXISTS (
        SELECT 1 FROM crm_record_permission p
        WHERE p.user_id = k.user_id AND p.source_object = k.source_object
          AND p.record_id = k.record_id AND p.can_read
    ) AS record_readable,
    ARRAY(
        SELECT f.field_name FROM crm_field_permission f
        WHERE f.user_id = k.user_id AND f.source_object = k.source_object AND f.can_read
        ORDER BY f.field_name
    ) AS readable_fields
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(user_id, source_object, record_id)
"""

SELECT_EXISTS: Final = """
SELECT EXISTS (
    SELECT 1 FROM crm_record WHERE source_object = $1 AND record_id = $2 AND NOT deleted
)
"""

# Compare-and-set: every expected field must hold exactly its expected value (an
# expected None matches an absent field or JSON null); on any mismatch no row
# changes. Deleted records are never written back.
CAS_FIELDS: Final = """
UPDATE crm_record
SET fields = fields || $4::jsonb, version = version + 1, updated_at = now()
WHERE source_object = $1 AND record_id = $2 AND NOT deleted
  AND NOT EXISTS (
    SELECT 1 FROM jsonb_each($3::jsonb) AS expected
    WHERE COALESCE(crm_record.fields -> expected.key, 'null'::jsonb)
          IS DISTINCT FROM expected.value
  )
RETURNING version
"""

# Loading merges the given fields into an existing record (fields it does not
# name, such as mirror fields written back by a push, are kept); the version
# moves only when something actually changed, so reloading a file is a no-op.
# An owner given replaces the record's (S-1); none given keeps what it had.
UPSERT_RECORD: Final = """
INSERT INTO crm_record (source_object, record_id, fields, version, deleted, updated_at, owner_key)
VALUES ($1, $2, $3::jsonb, 1, $4, now(), $5)
ON CONFLICT (source_object, record_id) DO UPDATE
SET fields = crm_record.fields || EXCLUDED.fields,
    deleted = EXCLUDED.deleted,
    owner_key = COALESCE(EXCLUDED.owner_key, crm_record.owner_key),
    version = crm_record.version + 1,
    updated_at = now()
WHERE NOT (crm_record.fields @> EXCLUDED.fields) OR crm_record.deleted <> EXCLUDED.deleted
   OR crm_record.owner_key IS DISTINCT FROM COALESCE(EXCLUDED.owner_key, crm_record.owner_key)
RETURNING version
"""

# The owner key of each named record (S-1); records the store does not have are omitted.
SELECT_OWNERS: Final = """
SELECT r.source_object, r.record_id, r.owner_key
FROM unnest($1::text[], $2::text[]) AS k(source_object, record_id)
JOIN crm_record r USING (source_object, record_id)
"""

UPSERT_OBJECT_PERMISSION: Final = """
INSERT INTO crm_object_permission (user_id, source_object, can_read)
VALUES ($1, $2, $3)
ON CONFLICT (user_id, source_object) DO UPDATE SET can_read = EXCLUDED.can_read
"""

DELETE_RECORD_PERMISSIONS: Final = """
DELETE FROM crm_record_permission WHERE user_id = $1 AND source_object = $2
"""

INSERT_RECORD_PERMISSIONS: Final = """
INSERT INTO crm_record_permission (user_id, source_object, record_id, can_read)
SELECT $1, $2, record_id, true FROM unnest($3::text[]) AS record_id
ON CONFLICT (user_id, source_object, record_id) DO UPDATE SET can_read = true
"""

# "Every record of the object" is resolved at load time against the store.
INSERT_ALL_RECORD_PERMISSIONS: Final = """
INSERT INTO crm_record_permission (user_id, source_object, record_id, can_read)
SELECT $1, $2, record_id, true FROM crm_record WHERE source_object = $2
ON CONFLICT (user_id, source_object, record_id) DO UPDATE SET can_read = true
"""

DELETE_FIELD_PERMISSIONS: Final = """
DELETE FROM crm_field_permission WHERE user_id = $1 AND source_object = $2
"""

INSERT_FIELD_PERMISSIONS: Final = """
INSERT INTO crm_field_permission (user_id, source_object, field_name, can_read)
SELECT $1, $2, field_name, true FROM unnest($3::text[]) AS field_name
ON CONFLICT (user_id, source_object, field_name) DO UPDATE SET can_read = true
"""

COUNT_RECORDS: Final = "SELECT count(*) FROM crm_record"


def _fields(text: str) -> dict[str, JsonValue]:
    parsed = json.loads(text)
    assert isinstance(parsed, dict)
    return parsed


def _json(value: Mapping[str, JsonValue]) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


async def select_record(conn: Conn, source_object: str, record_id: str) -> CrmRecordRow | None:
    """One record, deleted or not; None when the store never had it."""
    row = await conn.fetchrow(SELECT_RECORD, source_object, record_id)
    return None if row is None else _record(row)


async def select_records(
    conn: Conn, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], CrmRecordRow]:
    """The records named by `(source_object, record_id)`, deleted or not; absent ones omitted."""
    rows = await conn.fetch(SELECT_RECORDS, [k[0] for k in keys], [k[1] for k in keys])
    return {(r["source_object"], r["record_id"]): _record(r) for r in rows}


def _record(row: Record) -> CrmRecordRow:
    return CrmRecordRow(
        source_object=row["source_object"],
        record_id=row["record_id"],
        fields=_fields(row["fields"]),
        version=row["version"],
        deleted=row["deleted"],
        updated_at=row["updated_at"],
    )


async def select_permissions_many(
    conn: Conn, keys: Sequence[tuple[str, str, str]]
) -> dict[tuple[str, str, str], PermissionRow]:
    """`select_permissions` for every `(user_id, source_object, record_id)` at once."""
    rows = await conn.fetch(SELECT_PERMISSIONS_MANY, *([k[i] for k in keys] for i in range(3)))
    return {
        (r["user_id"], r["source_object"], r["record_id"]): PermissionRow(
            object_readable=r["object_readable"],
            record_readable=r["record_readable"],
            readable_fields=frozenset(r["readable_fields"]),
        )
        for r in rows
    }


async def select_permissions(
    conn: Conn, user_id: str, source_object: str, record_id: str
) -> PermissionRow:
    row = await conn.fetchrow(SELECT_PERMISSIONS, user_id, source_object, record_id)
    assert row is not None
    return PermissionRow(
        object_readable=row["object_readable"],
        record_readable=row["record_readable"],
        readable_fields=frozenset(row["readable_fields"]),
    )


async def record_exists(conn: Conn, source_object: str, record_id: str) -> bool:
    """True when the record is present and not deleted."""
    return bool(await conn.fetchval(SELECT_EXISTS, source_object, record_id))


async def compare_and_set_fields(
    conn: Conn,
    source_object: str,
    record_id: str,
    expected: Mapping[str, JsonValue],
    new: Mapping[str, JsonValue],
) -> int | None:
    """The record's new version, or None when the CAS did not apply (nothing changed)."""
    version = await conn.fetchval(CAS_FIELDS, source_object, record_id, _json(expected), _json(new))
    return None if version is None else int(version)


async def upsert_record(
    conn: Conn,
    source_object: str,
    record_id: str,
    fields: Mapping[str, JsonValue],
    *,
    deleted: bool = False,
    owner_key: str | None = None,
) -> int | None:
    """Insert or merge a record; its version when written, None when already identical.
    `owner_key`: the connector owner it belongs to (S-1); None keeps the stored one."""
    version = await conn.fetchval(
        UPSERT_RECORD, source_object, record_id, _json(fields), deleted, owner_key
    )
    return None if version is None else int(version)


async def select_owners(
    conn: Conn, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], str | None]:
    """The owner key of each `(source_object, record_id)` held (None: loaded without one)."""
    rows = await conn.fetch(SELECT_OWNERS, [k[0] for k in keys], [k[1] for k in keys])
    return {(r["source_object"], r["record_id"]): r["owner_key"] for r in rows}


async def upsert_object_permission(
    conn: Conn, user_id: str, source_object: str, can_read: bool
) -> None:
    await conn.execute(UPSERT_OBJECT_PERMISSION, user_id, source_object, can_read)


async def delete_record_permissions(conn: Conn, user_id: str, source_object: str) -> None:
    await conn.execute(DELETE_RECORD_PERMISSIONS, user_id, source_object)


async def insert_record_permissions(
    conn: Conn, user_id: str, source_object: str, record_ids: Sequence[str]
) -> None:
    await conn.execute(INSERT_RECORD_PERMISSIONS, user_id, source_object, list(record_ids))


async def insert_all_record_permissions(conn: Conn, user_id: str, source_object: str) -> None:
    """Grant `user_id` every record of `source_object` present in the store now."""
    await conn.execute(INSERT_ALL_RECORD_PERMISSIONS, user_id, source_object)


async def delete_field_permissions(conn: Conn, user_id: str, source_object: str) -> None:
    await conn.execute(DELETE_FIELD_PERMISSIONS, user_id, source_object)


async def insert_field_permissions(
    conn: Conn, user_id: str, source_object: str, field_names: Sequence[str]
) -> None:
    await conn.execute(INSERT_FIELD_PERMISSIONS, user_id, source_object, list(field_names))


async def count_records(conn: Conn) -> int:
    return int(await conn.fetchval(COUNT_RECORDS))
