"""Named queries in batch form: one statement for a whole batch of saves (API-3, bench P7).

Each is the set-wise form of a `db.links` query (named in its docstring), run on a
connection the caller owns, in the caller's transaction.
"""

from __future__ import annotations

from typing import Any, Final

from db import attempt_request
from db import revalidation_scope as scope_q
from db.links import Row
from db.records import Conn


async def keep_generic_plans(conn: Conn) -> None:
    """For the rest of the caller's transaction, run these statements on their generic
    plans. One save binds them to one-element arrays, and under the default
    plan_cache_mode Postgres finds a generic plan dearer than a one-element custom plan
    and plans the statement again on every call: measured with pg_stat_statements, five
    statements re-planned per save, 0.7 ms of Postgres's CPU per create. Their
    generic plans are the same index probes (tests/db/test_admission_plans.py). Batches
    (`push`) keep the default."""
    await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")


async def lock_link_keys(conn: Conn, link_keys: list[str]) -> None:
    """`lock_link_key` for every key, in one statement and in link-key order (the global
    order every multi-key transaction locks in, so two of them cannot deadlock)."""
    await scope_q.lock_link_keys(conn, link_keys)  # owner scopes (shared) first


# G-2: the advisory lock of a record's identity (owner key, source object, record id),
# in the two-key form, whose lock space is apart from the link keys' one-key form; its
# class and key are SQL functions (migration 0190), whose trigger refuses an attempt row
# inserted without it. Every admission takes its records' locks before it reads what the
# prior-ownership gate weighs, so two saves of one record under two slots (two link keys,
# two link-key locks) decide one after the other: the second reads the first's
# reservation. Taken in the order of the lock values themselves, after every link-key
# lock, and by nothing else: two batches cannot deadlock, and a hash collision only
# serializes two records that need not be.
LOCK_RECORDS: Final = """
SELECT pg_advisory_xact_lock(connector_record_lock_class(), h)
FROM (SELECT DISTINCT connector_record_lock_key(o, s, r) AS h
      FROM unnest($1::text[], $2::text[], $3::text[]) AS t(o, s, r)) AS records
ORDER BY h
"""


async def lock_records(conn: Conn, records: list[tuple[str, str, str]]) -> None:
    """Lock each (owner key, source object, record id) for this transaction (G-2)."""
    await conn.execute(LOCK_RECORDS, *([record[i] for record in records] for i in range(3)))


async def links_by_keys(conn: Conn, link_keys: list[str]) -> dict[str, Row]:
    """`link_by_key` for every key at once, locked for this transaction."""
    rows = await conn.fetch(
        "SELECT * FROM connector_remote_link WHERE link_key = ANY($1::text[]) FOR UPDATE",
        link_keys,
    )
    return {r["link_key"]: r for r in rows}


async def attempt_statuses_by_keys(conn: Conn, link_keys: list[str]) -> list[Row]:
    """`attempt_statuses` of every key at once, by key and then ordinal."""
    return await conn.fetch(
        """
        SELECT link_key, attempt_id, status, attempt_ordinal, dispatch_lane
        FROM connector_push_attempt WHERE link_key = ANY($1::text[])
        ORDER BY link_key, attempt_ordinal
        """,
        link_keys,
    )


async def lineage_rows_many(conn: Conn, loci: list[tuple[str, str, str, str]]) -> list[Row]:
    """`lineage_rows` for every (owner key, predecessor slot, source object, record id) at
    once: each link (kind 'link') and attempt (kind 'attempt') found there, with its key."""
    return await conn.fetch(
        """
        WITH k AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
                AS k(owner_key, slot_id, source_object, record_id)
        )
        SELECT 'link' AS kind, l.link_key, l.connector_owner_key, l.action_slot_id,
               l.source_object, l.source_record_id, l.status, l.remote_id,
               NULL::uuid AS attempt_id, NULL::integer AS attempt_ordinal,
               NULL::text AS dispatch_lane
        FROM connector_remote_link l JOIN k
          ON l.connector_owner_key = k.owner_key AND l.action_slot_id = k.slot_id
         AND l.source_object = k.source_object AND l.source_record_id = k.record_id
        UNION ALL
        SELECT 'attempt', a.link_key, a.connector_owner_key, a.action_slot_id,
               a.source_object, a.source_record_id, a.status, NULL,
               a.attempt_id, a.attempt_ordinal, a.dispatch_lane
        FROM connector_push_attempt a JOIN k
          ON a.connector_owner_key = k.owner_key AND a.action_slot_id = k.slot_id
         AND a.source_object = k.source_object AND a.source_record_id = k.record_id
        ORDER BY link_key, attempt_ordinal NULLS FIRST
        """,
        *([locus[i] for locus in loci] for i in range(4)),
    )


async def insert_attempts(conn: Conn, rows: list[dict[str, Any]]) -> None:
    """`insert_attempt` for many `pending` attempts in one statement, both rows of each
    (`db.attempt_request`); every row names the same columns (attempt_id included). The
    ID-5 index still rejects a second occupant."""
    await attempt_request.insert_attempts(conn, rows)


async def record_rows_many(conn: Conn, records: list[tuple[str, str, str]]) -> list[Row]:
    """Every link (kind 'link') and attempt (kind 'attempt') of each (owner key, source
    object, record id), under any action or destination slot, with its key: what the
    prior-ownership gate (GATE-1) and the lineage check (ID-6) weigh."""
    return await conn.fetch(
        """
        WITH k AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
                AS k(owner_key, source_object, record_id)
        )
        SELECT 'link' AS kind, l.link_key, l.connector_owner_key, l.action_slot_id,
               l.destination_slot_id, l.source_object, l.source_record_id, l.status,
               l.remote_id, NULL::uuid AS attempt_id, NULL::integer AS attempt_ordinal,
               NULL::text AS dispatch_lane
        FROM connector_remote_link l JOIN k
          ON l.connector_owner_key = k.owner_key
         AND l.source_object = k.source_object AND l.source_record_id = k.record_id
        UNION ALL
        SELECT 'attempt', a.link_key, a.connector_owner_key, a.action_slot_id,
               a.destination_slot_id, a.source_object, a.source_record_id, a.status, NULL,
               a.attempt_id, a.attempt_ordinal, a.dispatch_lane
        FROM connector_push_attempt a JOIN k
          ON a.connector_owner_key = k.owner_key
         AND a.source_object = k.source_object AND a.source_record_id = k.record_id
        ORDER BY link_key, attempt_ordinal NULLS FIRST
        """,
        *([record[i] for record in records] for i in range(3)),
    )
