"""The local record store (SPEC PACK-3): one small interface over the CRM's records.

`RecordStore` is what admission and mirror writeback depend on; `PostgresRecordStore`
implements it over `crm_record` and the permission tables, so a deployment can
swap in an adapter for the CRM's own store without touching the callers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Protocol, TypeAlias

import asyncpg
from pydantic import JsonValue

from db import records as q
from protocol.authority import PermissionFacts

# One local record as the store holds it; `deleted` records are still returned.
LocalRecord: TypeAlias = q.CrmRecordRow


class RecordStore(Protocol):
    async def read_record(self, source_object: str, record_id: str) -> LocalRecord | None:
        """The record (even if deleted), or None when the store never had it."""
        ...

    async def read_permissions(
        self, user_id: str, source_object: str, record_id: str
    ) -> PermissionFacts:
        """The user's read facts; anything not granted is unreadable (fail closed)."""
        ...

    async def read_records(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], LocalRecord]:
        """`read_record` for every `(source_object, record_id)` at once; absent ones omitted."""
        ...

    async def read_permissions_many(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], PermissionFacts]:
        """`read_permissions` for every `(user_id, source_object, record_id)` at once."""
        ...

    async def compare_and_set_mirror(
        self,
        source_object: str,
        record_id: str,
        expected: Mapping[str, JsonValue],
        new: Mapping[str, JsonValue],
    ) -> bool:
        """Write `new` only if every `expected` field holds its value (None: absent or null).

        False, with nothing changed, on any mismatch or a deleted/missing record.
        Every field in `new` must appear in `expected`: a writeback never writes blind.
        """
        ...

    async def exists(self, source_object: str, record_id: str) -> bool:
        """True when the record is present and not deleted."""
        ...

    async def read_owners(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], str | None]:
        """The connector owner key of each `(source_object, record_id)` the store holds
        (S-1); None for a record it holds without one; absent records omitted."""
        ...


PoolOrConnection: TypeAlias = "asyncpg.Pool[asyncpg.Record] | q.Conn"


class PostgresRecordStore:
    """`RecordStore` over Postgres.

    Given a pool, each call takes its own connection; given a connection, calls
    run on it, inside whatever transaction the caller has open.
    """

    def __init__(self, db: PoolOrConnection) -> None:
        self._db = db

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[q.Conn]:
        if isinstance(self._db, asyncpg.Pool):
            async with self._db.acquire() as conn:
                yield conn
        else:
            yield self._db

    async def read_record(self, source_object: str, record_id: str) -> LocalRecord | None:
        async with self._conn() as conn:
            return await q.select_record(conn, source_object, record_id)

    async def read_permissions(
        self, user_id: str, source_object: str, record_id: str
    ) -> PermissionFacts:
        async with self._conn() as conn:
            row = await q.select_permissions(conn, user_id, source_object, record_id)
        return _facts(row)

    async def read_records(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], LocalRecord]:
        async with self._conn() as conn:
            return await q.select_records(conn, keys)

    async def read_permissions_many(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], PermissionFacts]:
        async with self._conn() as conn:
            rows = await q.select_permissions_many(conn, keys)
        return {key: _facts(row) for key, row in rows.items()}

    async def compare_and_set_mirror(
        self,
        source_object: str,
        record_id: str,
        expected: Mapping[str, JsonValue],
        new: Mapping[str, JsonValue],
    ) -> bool:
        unguarded = sorted(set(new) - set(expected))
        if unguarded:
            raise ValueError(f"compare_and_set_mirror: no expected value for {unguarded}")
        async with self._conn() as conn:
            version = await q.compare_and_set_fields(conn, source_object, record_id, expected, new)
        return version is not None

    async def exists(self, source_object: str, record_id: str) -> bool:
        async with self._conn() as conn:
            return await q.record_exists(conn, source_object, record_id)

    async def read_owners(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], str | None]:
        async with self._conn() as conn:
            return await q.select_owners(conn, keys)


def _facts(row: q.PermissionRow) -> PermissionFacts:
    return PermissionFacts(
        object_readable=row.object_readable,
        record_readable=row.record_readable,
        readable_fields=row.readable_fields,
    )
