"""Named queries for bulk mapping revalidation (SPEC §9): locked reads, receipts, the CAS move.

One statement per function, each over a page of members; the caller owns the
transaction and holds the owner scope lock (db/revalidation_scope.py) before any of
them. Rows map to `protocol.revalidation` models. Nothing here reads or writes
attempts beyond the occupancy read, nor local records, nor anything remote (REV-3).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Final, NamedTuple

from asyncpg import Record
from pydantic import JsonValue

from db.records import Conn
from protocol.link_row import MOVED_COLUMNS, LinkRowState
from protocol.revalidation import RevalidationReceipt
from protocol.revalidation_manifest import RevalidationMember
from protocol.trusted import trusted

# The LinkRowState columns, uuids as text and the profile snapshot as JSON text.
LINK_STATE_COLUMNS: Final = """
link_key, status, connector_owner_key, action_slot_id, action_type, source_object,
source_record_id, destination_slot_id, created_pack_install_id::text AS created_pack_install_id,
remote_id, remote_scope, connector_namespace, flow_developer_name, flow_action_name,
flow_version, target_object, profile_name,
last_validated_pack_install_id::text AS last_validated_pack_install_id,
credential_ref, credential_generation_hash, endpoint_class, endpoint_binding_hash,
retry_policy_hash, profile_payload_hash, profile_snapshot::text AS profile_snapshot,
create_path_template, update_path_template, response_id_path, mirror_source_object,
mirror_remote_id_field, mirror_provenance_field, mapping_fingerprint, body_fingerprint,
last_mapping_revalidation_operation_id
"""

_RECEIPT: Final = """
operation_id, link_key, manifest_digest, approval_digest, mapping_fingerprint_algorithm,
body_fingerprint_algorithm, old_mapping_fingerprint, new_mapping_fingerprint,
old_body_fingerprint, new_body_fingerprint, old_pack_install_id::text AS old_pack_install_id,
new_pack_install_id::text AS new_pack_install_id, previous_operation_id, before_row_digest,
after_row_digest
"""

# The owner keys of the links of a manifest held in memory (a JSON document manifest;
# a JSON Lines one names its owner key in its header).
SELECT_OWNERS_OF: Final = """
SELECT DISTINCT connector_owner_key FROM connector_remote_link WHERE link_key = ANY($1::text[])
"""

SELECT_LINK_FOR_UPDATE: Final = f"""
SELECT {LINK_STATE_COLUMNS} FROM connector_remote_link WHERE link_key = $1 FOR UPDATE
"""

SELECT_LINKS: Final = f"""
SELECT {LINK_STATE_COLUMNS} FROM connector_remote_link
WHERE link_key = ANY($1::text[]) ORDER BY link_key COLLATE "C"
"""

SELECT_FINALIZED_LINKS: Final = f"""
SELECT {LINK_STATE_COLUMNS} FROM connector_remote_link
WHERE connector_owner_key = $1 AND status = 'finalized' ORDER BY link_key COLLATE "C"
"""

# The page forms below run one statement for a page of members, keys in link-key order
# (members are sorted, invariant 1).
# Row locks are taken in the sorted order too (the lock step runs above the sort). The
# row_version (bumped by every UPDATE of the link) is what the move compares-and-sets on.
SELECT_LINKS_FOR_UPDATE: Final = f"""
SELECT {LINK_STATE_COLUMNS}, row_version FROM connector_remote_link
WHERE link_key = ANY($1::text[]) ORDER BY link_key COLLATE "C" FOR UPDATE
"""

# ID-5: the statuses that release the create slot are the only non-occupying ones.
SELECT_OCCUPYING_ATTEMPTS: Final = """
SELECT link_key, attempt_id::text AS attempt_id FROM connector_push_attempt
WHERE link_key = ANY($1::text[]) AND status NOT IN ('finalized', 'superseded')
ORDER BY link_key, attempt_ordinal
"""

# The receipt each (link key, pointer) pair names.
SELECT_POINTER_RECEIPTS: Final = f"""
SELECT {_RECEIPT} FROM connector_link_revalidation_receipt
JOIN unnest($1::text[], $2::text[]) AS p (link_key, operation_id)
    USING (link_key, operation_id)
"""

SELECT_OPERATION_RECEIPTS: Final = f"""
SELECT {_RECEIPT} FROM connector_link_revalidation_receipt
WHERE operation_id = $1 ORDER BY link_key COLLATE "C"
"""

# The receipt columns a revalidation writes (created_at takes its default), in the order
# `_receipt_params` gives them. Written by binary COPY: about twice as fast as INSERT from
# fifteen unnested arrays at 100,000 receipts (bench P4); the table's constraints
# (primary key, foreign key to the link) and triggers hold as for any INSERT.
RECEIPT_COLUMNS: Final = (
    "operation_id", "link_key", "manifest_digest", "approval_digest",
    "mapping_fingerprint_algorithm", "body_fingerprint_algorithm",
    "old_mapping_fingerprint", "new_mapping_fingerprint",
    "old_body_fingerprint", "new_body_fingerprint",
    "old_pack_install_id", "new_pack_install_id",
    "previous_operation_id", "before_row_digest", "after_row_digest",
)  # fmt: skip

# Compare-and-set per member on the exact tuple read under its lock: its row_version
# (touch_versioned_row bumps it on every UPDATE, so no write of any kind came between), and
# still finalized with the old tuple and the expected pointer; the receipt named by the new
# pointer must already exist. A member whose row does not match is simply not returned.
# `as_planned` says the moved row is that tuple with exactly the planned values in the
# moved columns: every other digested column is as it was, so no trigger rewrote one on
# the way. The digested columns are `LinkRowState`'s fields (a db test holds every column
# to digested-or-excluded), compared as one row: two to_jsonb of the whole row per member
# cost apply about 5 s per 100,000 links (bench P4).
_KEPT_COLUMNS: Final = sorted(set(LinkRowState.model_fields) - MOVED_COLUMNS)


def _kept(row: str) -> str:
    return ", ".join(f"{row}.{column}" for column in _KEPT_COLUMNS)


MOVE_LINKS_MAPPING: Final = f"""
UPDATE connector_remote_link
SET mapping_fingerprint = m.new_mapping, body_fingerprint = m.new_body,
    last_validated_pack_install_id = m.new_install,
    last_mapping_revalidation_operation_id = $2,
    last_operator = $10, last_operator_reason = $11, last_operator_at = now()
FROM unnest(
    $1::text[], $3::text[], $4::text[], $5::uuid[], $6::text[], $7::text[], $8::uuid[],
    $9::text[], $12::bigint[]
) AS m (member_key, new_mapping, new_body, new_install, old_mapping, old_body, old_install,
        expected_operation, read_version)
WHERE link_key = m.member_key AND row_version = m.read_version AND status = 'finalized'
  AND mapping_fingerprint = m.old_mapping AND body_fingerprint = m.old_body
  AND last_validated_pack_install_id = m.old_install
  AND last_mapping_revalidation_operation_id IS NOT DISTINCT FROM m.expected_operation
RETURNING new.link_key,
    ({_kept("new")}) IS NOT DISTINCT FROM ({_kept("old")})
    AND new.mapping_fingerprint = m.new_mapping AND new.body_fingerprint = m.new_body
    AND new.last_validated_pack_install_id = m.new_install
    AND new.last_mapping_revalidation_operation_id = $2 AS as_planned
"""

# OPS-2: one audit entry per member, read back from the receipts this operation just wrote
# (their exact before/after), in link-key order: one statement, no per-member Python (P4).
# The approver is who acted; the command is AuditCommand.REVALIDATE_APPLY ($2).
INSERT_OPERATION_AUDIT: Final = """
INSERT INTO connector_operator_audit
    (operator, reason, command, link_key, arguments, state_before, state_after, outcome)
SELECT $3, $4, $2, r.link_key,
    jsonb_build_object('operation_id', r.operation_id, 'approval_reference', $5::text,
                       'manifest_digest', r.manifest_digest),
    jsonb_build_object('mapping_fingerprint', r.old_mapping_fingerprint,
                       'body_fingerprint', r.old_body_fingerprint,
                       'last_validated_pack_install_id', r.old_pack_install_id::text,
                       'revalidation_operation_id', r.previous_operation_id),
    jsonb_build_object('mapping_fingerprint', r.new_mapping_fingerprint,
                       'body_fingerprint', r.new_body_fingerprint,
                       'last_validated_pack_install_id', r.new_pack_install_id::text,
                       'revalidation_operation_id', r.operation_id),
    'revalidated by ' || r.operation_id
FROM connector_link_revalidation_receipt r
WHERE r.operation_id = $1
ORDER BY r.link_key COLLATE "C"
"""


def link_states_of(rows: Iterable[Record]) -> Iterator[LinkRowState]:
    """The rows as models. A bulk read's links mostly share one profile snapshot, so each
    distinct snapshot text is parsed once and shared by the models read with it (NF-7:
    their digests then encode it once, protocol.link_row). The columns are the model's
    fields with their types (LINK_STATE_COLUMNS: text or null, the snapshot JSON text), so
    the models are made without validating them again (protocol.trusted; NF-7);
    nothing mutates a model's snapshot. `rows` are one statement's (the same columns)."""
    snapshots: dict[str, JsonValue] = {}
    names: tuple[str, ...] | None = None
    for row in rows:
        if names is None:
            names = tuple(row.keys())
        values = dict(zip(names, row, strict=True))  # a third cheaper than dict(row)
        values.pop("row_version", None)  # read beside the state for the compare-and-set
        text = values["profile_snapshot"]
        if text is not None:
            if text not in snapshots:
                snapshots[text] = json.loads(text)
            # The one parsed snapshot, shared by the rows read with it.
            values["profile_snapshot"] = snapshots[text]
        yield trusted(LinkRowState, values)


def _receipt(row: Record) -> RevalidationReceipt:
    return RevalidationReceipt.model_validate(dict(row))


async def link_state_for_update(conn: Conn, link_key: str) -> LinkRowState | None:
    row = await conn.fetchrow(SELECT_LINK_FOR_UPDATE, link_key)
    return None if row is None else next(link_states_of([row]))


async def link_states(conn: Conn, link_keys: list[str]) -> list[LinkRowState]:
    """Unlocked reads for planning, in link-key order; absent keys are simply missing."""
    return list(link_states_of(await conn.fetch(SELECT_LINKS, link_keys)))


async def finalized_link_states(conn: Conn, owner_key: str) -> list[LinkRowState]:
    return list(link_states_of(await conn.fetch(SELECT_FINALIZED_LINKS, owner_key)))


async def operation_receipts(conn: Conn, operation_id: str) -> list[RevalidationReceipt]:
    return [_receipt(row) for row in await conn.fetch(SELECT_OPERATION_RECEIPTS, operation_id)]


async def owners_of(conn: Conn, link_keys: list[str]) -> list[str]:
    return [row[0] for row in await conn.fetch(SELECT_OWNERS_OF, link_keys)]


# -- the page forms (bench P4: one statement per page, not per member) --------------


class LockedRow(NamedTuple):
    """A link's digested state and the row_version it was read at, under its row lock."""

    state: LinkRowState
    version: int


async def rows_for_update(conn: Conn, link_keys: list[str]) -> list[Record]:
    """The rows of `link_keys` that exist, locked, as Postgres returns them (absent keys
    are simply missing): `locked_rows` makes them models, in the caller's own time, so
    the connection moves on to its next statement first (NF-7)."""
    return await conn.fetch(SELECT_LINKS_FOR_UPDATE, link_keys)


def locked_rows(rows: list[Record]) -> Iterator[LockedRow]:
    """`rows_for_update`'s rows as models, one at a time."""
    for row, state in zip(rows, link_states_of(rows), strict=True):
        yield LockedRow(state, row["row_version"])


async def occupying_attempts(conn: Conn, link_keys: list[str]) -> dict[str, tuple[str, ...]]:
    """Occupying attempt ids by link key, in ordinal order; unoccupied links are missing."""
    found: dict[str, list[str]] = {}
    for row in await conn.fetch(SELECT_OCCUPYING_ATTEMPTS, link_keys):
        found.setdefault(row["link_key"], []).append(row["attempt_id"])
    return {key: tuple(ids) for key, ids in found.items()}


async def pointer_receipt_rows(conn: Conn, pointers: dict[str, str]) -> list[Record]:
    """The receipt each link's pointer names (link key -> operation id), as rows for
    `receipts_by_link`."""
    return await conn.fetch(SELECT_POINTER_RECEIPTS, list(pointers), list(pointers.values()))


def receipts_by_link(rows: Iterable[Record]) -> dict[str, RevalidationReceipt]:
    return {row["link_key"]: _receipt(row) for row in rows}


async def insert_receipts(conn: Conn, receipts: list[RevalidationReceipt]) -> None:
    await conn.copy_records_to_table(
        "connector_link_revalidation_receipt",
        columns=RECEIPT_COLUMNS,
        records=[_receipt_params(r) for r in receipts],
    )


def _receipt_params(r: RevalidationReceipt) -> tuple[object, ...]:
    return (
        r.operation_id, r.link_key, r.manifest_digest, r.approval_digest,
        r.mapping_fingerprint_algorithm, r.body_fingerprint_algorithm,
        r.old_mapping_fingerprint, r.new_mapping_fingerprint,
        r.old_body_fingerprint, r.new_body_fingerprint,
        r.old_pack_install_id, r.new_pack_install_id,
        r.previous_operation_id, r.before_row_digest, r.after_row_digest,
    )  # fmt: skip


async def move_links_mapping(
    conn: Conn,
    members: list[RevalidationMember],
    read_versions: list[int],
    operation_id: str,
    operator: tuple[str, str],
) -> dict[str, bool]:
    """Move each member's fingerprints, install and pointer iff its row is still the tuple
    read at `read_versions` (the members' order) holding the old ones, stamping `operator`
    (who, why) on the links (outside the row digest). Returns, by link key, whether the
    moved row is exactly its old self with the planned values moved; a member that did not
    match is absent."""
    rows = await conn.fetch(
        MOVE_LINKS_MAPPING,
        [m.link_key for m in members], operation_id,
        [m.new_mapping_fingerprint for m in members],
        [m.new_body_fingerprint for m in members],
        [m.new_pack_install_id for m in members],
        [m.old_mapping_fingerprint for m in members],
        [m.old_body_fingerprint for m in members],
        [m.old_pack_install_id for m in members],
        [m.expected_revalidation_operation_id for m in members],
        operator[0], operator[1], read_versions,
    )  # fmt: skip
    return {row["link_key"]: row["as_planned"] for row in rows}


async def audit_operation(
    conn: Conn, operation_id: str, command: str, approval: tuple[str, str, str]
) -> None:
    """Append one audit entry per receipt of `operation_id`, in the caller's transaction
    (approval: who, why, reference)."""
    await conn.execute(INSERT_OPERATION_AUDIT, operation_id, command, *approval)


SELECT_OPERATION_EXISTS: Final = """
SELECT EXISTS (SELECT 1 FROM connector_link_revalidation_receipt WHERE operation_id = $1)
"""


async def operation_exists(conn: Conn, operation_id: str) -> bool:
    return bool(await conn.fetchval(SELECT_OPERATION_EXISTS, operation_id))


SELECT_PAGE_RECEIPTS: Final = f"""
SELECT {_RECEIPT} FROM connector_link_revalidation_receipt
WHERE operation_id = $1 AND link_key = ANY($2::text[])
"""


async def page_receipts(
    conn: Conn, operation_id: str, link_keys: list[str]
) -> dict[str, RevalidationReceipt]:
    """The receipts `operation_id` wrote for any of `link_keys`, by link key."""
    rows = await conn.fetch(SELECT_PAGE_RECEIPTS, operation_id, link_keys)
    return {row["link_key"]: _receipt(row) for row in rows}


# A verify-only retry keeps the manifest's keys in a temporary table, a page at a time, to
# find receipts under the operation whose link is not a member (invariant 5), set-wise.
CREATE_STAGED_KEYS: Final = """
CREATE TEMPORARY TABLE IF NOT EXISTS revalidation_member_key (link_key text PRIMARY KEY)
ON COMMIT DROP
"""

SELECT_RECEIPTS_NOT_STAGED: Final = """
SELECT r.link_key FROM connector_link_revalidation_receipt r
WHERE r.operation_id = $1
  AND NOT EXISTS (SELECT 1 FROM revalidation_member_key m WHERE m.link_key = r.link_key)
ORDER BY r.link_key COLLATE "C" LIMIT $2
"""


async def stage_member_keys(conn: Conn, link_keys: list[str]) -> None:
    await conn.execute(CREATE_STAGED_KEYS)
    await conn.copy_records_to_table(
        "revalidation_member_key", columns=("link_key",), records=[(k,) for k in link_keys]
    )


async def receipts_not_staged(conn: Conn, operation_id: str, limit: int) -> list[str]:
    """Up to `limit` link keys with a receipt under `operation_id` and not staged."""
    return [row[0] for row in await conn.fetch(SELECT_RECEIPTS_NOT_STAGED, operation_id, limit)]
