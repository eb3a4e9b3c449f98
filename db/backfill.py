"""Named queries for legacy-link adoption (SPEC MIG-1): records, links, attempts, installs.

One statement per function, mapped to `protocol.backfill` facts; the caller
owns the transaction and takes the link-key locks (db/links.lock_link_key) in
link-key order before reading facts it will act on. The one write is
`insert_links`, the set-wise form of db/links.insert_link: the ID-4 index decides.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from asyncpg import Record

from db import row_sets
from db.records import Conn
from protocol.backfill_facts import AttemptFact, LegacyRecord, LinkFact, Locator
from protocol.states import AttemptStatus, LinkStatus

COUNT_RECORDS: Final = """
SELECT count(*) FROM crm_record WHERE source_object = ANY($1::text[])
"""

# Keyset pages in record-id order (deleted records included: they are reported), in the
# database's collation so that the primary key's index serves every page whatever the
# cluster's locale; `{after}` is empty for the first page, else `AND record_id > $2`
# (two statements, so that a cached generic plan never loses the index range).
_RECORD_PAGE: Final = """
SELECT {columns} FROM crm_record
WHERE source_object = $1 {after}
ORDER BY record_id
LIMIT ${limit}
"""
_RECORD: Final = "source_object, record_id, fields::text AS fields, deleted"
_AFTER: Final = "AND record_id > $2"
SELECT_RECORD_PAGE: Final = _RECORD_PAGE.format(columns=_RECORD, after=_AFTER, limit=3)
SELECT_FIRST_RECORD_PAGE: Final = _RECORD_PAGE.format(columns=_RECORD, after="", limit=2)
SELECT_RECORD_ID_PAGE: Final = _RECORD_PAGE.format(columns="record_id", after=_AFTER, limit=3)
SELECT_FIRST_RECORD_ID_PAGE: Final = _RECORD_PAGE.format(columns="record_id", after="", limit=2)

SELECT_RECORDS: Final = """
SELECT source_object, record_id, fields::text AS fields, deleted
FROM crm_record
WHERE source_object = $1 AND record_id = ANY($2::text[])
ORDER BY record_id
"""

_LINK_FACT: Final = """
link_key, action_slot_id, connector_owner_key, destination_slot_id, remote_scope, remote_id,
status
"""

SELECT_LINKS: Final = f"""
SELECT {_LINK_FACT} FROM connector_remote_link
WHERE link_key = ANY($1::text[]) ORDER BY link_key COLLATE "C"
"""

# One probe of the locator index (ID-4's, unique) per locator. `OFFSET 0` keeps the
# subquery from being flattened into a join the planner may cost from statistics taken
# when the table was small (a backfill usually starts on an empty one): a hash join over
# every link of the owner, on every page, for the rest of the run
# (tests/db/test_backfill_plans.py).
SELECT_LOCATOR_OWNERS: Final = f"""
SELECT l.* FROM unnest($2::text[], $3::text[], $4::text[]) AS c (destination, scope, remote_id)
CROSS JOIN LATERAL (
  SELECT {_LINK_FACT} FROM connector_remote_link
  WHERE connector_owner_key = $1 AND destination_slot_id = c.destination
    AND remote_scope = c.scope AND remote_id = c.remote_id AND status <> 'retired'
  OFFSET 0
) AS l
ORDER BY l.link_key COLLATE "C"
"""

SELECT_ATTEMPTS: Final = """
SELECT link_key, attempt_id::text AS attempt_id, status FROM connector_push_attempt
WHERE link_key = ANY($1::text[]) ORDER BY link_key COLLATE "C", attempt_ordinal
"""

# Remote ids held as a JSON string by more than one (action slot, record) at one
# destination and scope: the raw candidates for `protocol.backfill_evidence.contested`,
# found set-wise so that no process holds every claim (NF-7). One input row
# per (slot, remote-id field of a pair the slot reads); deleted records claim too.
SELECT_CONTESTED: Final = """
SELECT c.destination_slot_id, c.remote_scope, c.remote_id
FROM (
  SELECT s.action_slot_id, s.destination_slot_id, s.remote_scope, r.record_id,
         r.fields ->> s.field AS remote_id
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
       AS s (action_slot_id, source_object, destination_slot_id, remote_scope, field)
  JOIN crm_record AS r ON r.source_object = s.source_object
  WHERE jsonb_typeof(r.fields -> s.field) = 'string'
) AS c
GROUP BY c.destination_slot_id, c.remote_scope, c.remote_id
HAVING count(DISTINCT ROW(c.action_slot_id, c.record_id)) > 1
ORDER BY 1, 2, 3
"""

SELECT_INSTALL_MANIFESTS: Final = """
SELECT pack_install_id::text AS pack_install_id, manifest::text AS manifest
FROM pack_install WHERE pack_install_id = ANY($1::uuid[])
"""


def _record(row: Record) -> LegacyRecord:
    return LegacyRecord(
        source_object=row["source_object"],
        record_id=row["record_id"],
        fields=json.loads(row["fields"]),
        deleted=row["deleted"],
    )


def _link(row: Record) -> LinkFact:
    return LinkFact(
        link_key=row["link_key"],
        action_slot_id=row["action_slot_id"],
        locator=Locator(
            connector_owner_key=row["connector_owner_key"],
            destination_slot_id=row["destination_slot_id"],
            remote_scope=row["remote_scope"],
            remote_id=row["remote_id"],
        ),
        status=LinkStatus(row["status"]),
    )


async def count_records(conn: Conn, source_objects: Sequence[str]) -> int:
    return int(await conn.fetchval(COUNT_RECORDS, list(source_objects)))


async def record_page(
    conn: Conn, source_object: str, after: str | None, limit: int
) -> list[LegacyRecord]:
    """Up to `limit` records of `source_object` after record id `after` (None: from the start)."""
    if after is None:
        rows = await conn.fetch(SELECT_FIRST_RECORD_PAGE, source_object, limit)
    else:
        rows = await conn.fetch(SELECT_RECORD_PAGE, source_object, after, limit)
    return [_record(r) for r in rows]


async def record_id_page(
    conn: Conn, source_object: str, after: str | None, limit: int
) -> list[str]:
    """`record_page`'s record ids only (apply re-reads the records under its locks)."""
    if after is None:
        rows = await conn.fetch(SELECT_FIRST_RECORD_ID_PAGE, source_object, limit)
    else:
        rows = await conn.fetch(SELECT_RECORD_ID_PAGE, source_object, after, limit)
    return [r["record_id"] for r in rows]


async def records_by_id(
    conn: Conn, source_object: str, record_ids: Sequence[str]
) -> list[LegacyRecord]:
    rows = await conn.fetch(SELECT_RECORDS, source_object, list(record_ids))
    return [_record(r) for r in rows]


async def links_by_key(conn: Conn, link_keys: Sequence[str]) -> list[LinkFact]:
    return [_link(r) for r in await conn.fetch(SELECT_LINKS, list(link_keys))]


async def locator_owners(conn: Conn, locators: Sequence[Locator]) -> list[LinkFact]:
    """Non-retired links of the locators' owner that hold any of them (ID-4)."""
    if not locators:
        return []
    owners = {loc.connector_owner_key for loc in locators}
    assert len(owners) == 1, "one owner key per backfill"
    rows = await conn.fetch(
        SELECT_LOCATOR_OWNERS,
        owners.pop(),
        [loc.destination_slot_id for loc in locators],
        [loc.remote_scope for loc in locators],
        [loc.remote_id for loc in locators],
    )
    return [_link(r) for r in rows]


async def attempts_by_key(conn: Conn, link_keys: Sequence[str]) -> list[AttemptFact]:
    rows = await conn.fetch(SELECT_ATTEMPTS, list(link_keys))
    return [
        AttemptFact(
            link_key=r["link_key"], attempt_id=r["attempt_id"], status=AttemptStatus(r["status"])
        )
        for r in rows
    ]


async def contested_candidates(
    conn: Conn, claim_fields: Sequence[tuple[str, str, str, str, str]]
) -> list[tuple[str, str, str]]:
    """(destination slot, remote scope, remote id) held by two or more (slot, record).

    `claim_fields` rows are (action slot, source object, destination slot, remote scope,
    remote-id field). The caller keeps only the values its own rules call a claim."""
    if not claim_fields:
        return []
    columns = [list(column) for column in zip(*claim_fields, strict=True)]
    rows = await conn.fetch(SELECT_CONTESTED, *columns)
    return [(r["destination_slot_id"], r["remote_scope"], r["remote_id"]) for r in rows]


async def insert_links(conn: Conn, rows: Sequence[dict[str, Any]]) -> None:
    """`db.links.insert_link` for every row (all with the same columns), one statement
    (`db.row_sets`); the ID-4 index rejects the whole statement if any remote locator is
    owned."""
    await row_sets.insert_rows(conn, "connector_remote_link", rows)


async def install_manifests(conn: Conn, pack_install_ids: Sequence[str]) -> dict[str, object]:
    """pack_install_id -> stored manifest document (parsed JSON)."""
    rows = await conn.fetch(SELECT_INSTALL_MANIFESTS, list(pack_install_ids))
    return {r["pack_install_id"]: json.loads(r["manifest"]) for r in rows}
