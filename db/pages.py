"""Keyset pages of links and create attempts, newest first (NF-7; migration
0120): `WHERE (created_at, key) < (cursor) ORDER BY created_at DESC, key DESC LIMIT n`
walks an index from the cursor on, so a page costs the same at the millionth row as at
the first (OFFSET would read every row before it).

Each function streams the rows of one statement (a server-side cursor in a read-only
transaction), at most `limit + 1`: the extra row tells the caller the page was cut.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Final
from uuid import UUID

import asyncpg

from db.transition_sql import attempt_phase_sql

Row = asyncpg.Record
PREFETCH: Final = 1_000
NO_UUID: Final = UUID(int=0)

LINK_COLUMNS: Final = (
    "link_key, source_object, source_record_id, action_slot_id, status, remote_id, created_at"
)
ATTEMPT_COLUMNS: Final = (
    "attempt_id, link_key, source_record_id, attempt_ordinal, status, dispatch_lane, "
    "last_error, created_at"
)

# $1, $2: the cursor (null and anything for the first page); $3 the row count; $4 a status.
_PAGE: Final = """
SELECT {columns} FROM {table}
WHERE {status} (created_at, {key}) < (coalesce($1::timestamptz, 'infinity'), $2)
ORDER BY created_at DESC, {key} DESC
LIMIT $3
"""


def _page(columns: str, table: str, key: str, by_status: str | None) -> str:
    status = "" if by_status is None else f"status = $4 AND {by_status}"
    return _PAGE.format(columns=columns, table=table, key=key, status=status)


# An attempt's status index names its phase (migration 0351).
_ATTEMPT_PHASE: Final = f"phase = {attempt_phase_sql('$4::text')} AND"


LINKS_PAGE: Final = _page(LINK_COLUMNS, "connector_remote_link", "link_key", None)
LINKS_PAGE_BY_STATUS: Final = _page(LINK_COLUMNS, "connector_remote_link", "link_key", "")
ATTEMPTS_PAGE: Final = _page(ATTEMPT_COLUMNS, "connector_push_attempt", "attempt_id", None)
ATTEMPTS_PAGE_BY_STATUS: Final = _page(
    ATTEMPT_COLUMNS, "connector_push_attempt", "attempt_id", _ATTEMPT_PHASE
)


async def _stream(conn: asyncpg.Connection, sql: str, *args: object) -> AsyncGenerator[Row]:
    async with conn.transaction(readonly=True):
        async for row in conn.cursor(sql, *args, prefetch=PREFETCH):
            yield row


def links_page(
    conn: asyncpg.Connection,
    status: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> AsyncGenerator[Row]:
    """The newest `limit + 1` links older than `after` (all statuses, or one)."""
    when, key = after if after is not None else (None, "")
    if status is None:
        return _stream(conn, LINKS_PAGE, when, key, limit + 1)
    return _stream(conn, LINKS_PAGE_BY_STATUS, when, key, limit + 1, status)


def attempts_page(
    conn: asyncpg.Connection,
    status: str | None,
    after: tuple[datetime, UUID] | None,
    limit: int,
) -> AsyncGenerator[Row]:
    """The newest `limit + 1` create attempts older than `after` (all statuses, or one)."""
    when, key = after if after is not None else (None, NO_UUID)
    if status is None:
        return _stream(conn, ATTEMPTS_PAGE, when, key, limit + 1)
    return _stream(conn, ATTEMPTS_PAGE_BY_STATUS, when, key, limit + 1, status)
