"""Named queries for bulk mapping revalidation (SPEC §9): link locks, receipts, the CAS move.

One statement per function; the caller owns the transaction and takes the locks
in link-key order (seed invariant 3). Rows map to `protocol.revalidation`
models. Nothing here reads or writes attempts beyond the occupancy read, nor
local records, nor anything remote (REV-3).
"""

from __future__ import annotations

import json
import uuid
from typing import Final

from asyncpg import Record

from db.records import Conn
from protocol.revalidation import LinkRowState, RevalidationMember, RevalidationReceipt

# The LinkRowState columns, uuids as text and the profile snapshot as JSON text.
_LINK_STATE: Final = """
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

# The same key db/links.lock_link_key takes: admission, dispatch and operator
# actions of this link wait for the revalidation (and it for them).
LOCK_LINK_KEY: Final = "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))"

# The link's AttemptOccupancyKey, distinct from the link lock, taken after it.
LOCK_OCCUPANCY_KEY: Final = "SELECT pg_advisory_xact_lock(hashtextextended('occupancy:' || $1, 7))"

SELECT_LINK_FOR_UPDATE: Final = f"""
SELECT {_LINK_STATE} FROM connector_remote_link WHERE link_key = $1 FOR UPDATE
"""

SELECT_LINKS: Final = f"""
SELECT {_LINK_STATE} FROM connector_remote_link
WHERE link_key = ANY($1::text[]) ORDER BY link_key COLLATE "C"
"""

SELECT_FINALIZED_LINKS: Final = f"""
SELECT {_LINK_STATE} FROM connector_remote_link
WHERE connector_owner_key = $1 AND status = 'finalized' ORDER BY link_key COLLATE "C"
"""

# ID-5: the statuses that release the create slot are the only non-occupying ones.
SELECT_OCCUPYING_ATTEMPTS: Final = """
SELECT attempt_id::text AS attempt_id FROM connector_push_attempt
WHERE link_key = $1 AND status NOT IN ('finalized', 'superseded')
ORDER BY attempt_ordinal
"""

SELECT_RECEIPT: Final = f"""
SELECT {_RECEIPT} FROM connector_link_revalidation_receipt
WHERE operation_id = $1 AND link_key = $2
"""

SELECT_OPERATION_RECEIPTS: Final = f"""
SELECT {_RECEIPT} FROM connector_link_revalidation_receipt
WHERE operation_id = $1 ORDER BY link_key COLLATE "C"
"""

INSERT_RECEIPT: Final = """
INSERT INTO connector_link_revalidation_receipt (
    operation_id, link_key, manifest_digest, approval_digest, mapping_fingerprint_algorithm,
    body_fingerprint_algorithm, old_mapping_fingerprint, new_mapping_fingerprint,
    old_body_fingerprint, new_body_fingerprint, old_pack_install_id, new_pack_install_id,
    previous_operation_id, before_row_digest, after_row_digest
) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::uuid, $12::uuid, $13, $14, $15)
"""

# Compare-and-set: the row must still be finalized with exactly the old tuple and
# the expected pointer; the receipt named by the new pointer must already exist.
MOVE_LINK_MAPPING: Final = f"""
UPDATE connector_remote_link
SET mapping_fingerprint = $3, body_fingerprint = $4,
    last_validated_pack_install_id = $5::uuid, last_mapping_revalidation_operation_id = $2,
    last_operator = $10, last_operator_reason = $11, last_operator_at = now()
WHERE link_key = $1 AND status = 'finalized'
  AND mapping_fingerprint = $6 AND body_fingerprint = $7
  AND last_validated_pack_install_id = $8::uuid
  AND last_mapping_revalidation_operation_id IS NOT DISTINCT FROM $9
RETURNING {_LINK_STATE}
"""


def _link_state(row: Record) -> LinkRowState:
    values = dict(row)
    snapshot = values["profile_snapshot"]
    values["profile_snapshot"] = None if snapshot is None else json.loads(snapshot)
    return LinkRowState.model_validate(values)


def _receipt(row: Record) -> RevalidationReceipt:
    return RevalidationReceipt.model_validate(dict(row))


async def lock_link_key(conn: Conn, link_key: str) -> None:
    await conn.execute(LOCK_LINK_KEY, link_key)


async def lock_occupancy_key(conn: Conn, link_key: str) -> None:
    await conn.execute(LOCK_OCCUPANCY_KEY, link_key)


async def link_state_for_update(conn: Conn, link_key: str) -> LinkRowState | None:
    row = await conn.fetchrow(SELECT_LINK_FOR_UPDATE, link_key)
    return None if row is None else _link_state(row)


async def link_states(conn: Conn, link_keys: list[str]) -> list[LinkRowState]:
    """Unlocked reads for planning, in link-key order; absent keys are simply missing."""
    return [_link_state(row) for row in await conn.fetch(SELECT_LINKS, link_keys)]


async def finalized_link_states(conn: Conn, owner_key: str) -> list[LinkRowState]:
    return [_link_state(row) for row in await conn.fetch(SELECT_FINALIZED_LINKS, owner_key)]


async def occupying_attempt_ids(conn: Conn, link_key: str) -> tuple[str, ...]:
    rows = await conn.fetch(SELECT_OCCUPYING_ATTEMPTS, link_key)
    return tuple(str(row["attempt_id"]) for row in rows)


async def receipt(conn: Conn, operation_id: str, link_key: str) -> RevalidationReceipt | None:
    row = await conn.fetchrow(SELECT_RECEIPT, operation_id, link_key)
    return None if row is None else _receipt(row)


async def operation_receipts(conn: Conn, operation_id: str) -> list[RevalidationReceipt]:
    return [_receipt(row) for row in await conn.fetch(SELECT_OPERATION_RECEIPTS, operation_id)]


async def insert_receipt(conn: Conn, r: RevalidationReceipt) -> None:
    await conn.execute(
        INSERT_RECEIPT,
        r.operation_id, r.link_key, r.manifest_digest, r.approval_digest,
        r.mapping_fingerprint_algorithm, r.body_fingerprint_algorithm,
        r.old_mapping_fingerprint, r.new_mapping_fingerprint,
        r.old_body_fingerprint, r.new_body_fingerprint,
        uuid.UUID(r.old_pack_install_id), uuid.UUID(r.new_pack_install_id),
        r.previous_operation_id, r.before_row_digest, r.after_row_digest,
    )  # fmt: skip


async def move_link_mapping(
    conn: Conn, member: RevalidationMember, operation_id: str, operator: tuple[str, str]
) -> LinkRowState | None:
    """Move the fingerprints, install and pointer iff the row still holds the old ones,
    stamping `operator` (who, why) on the link; those columns are outside the row digest."""
    row = await conn.fetchrow(
        MOVE_LINK_MAPPING,
        member.link_key, operation_id,
        member.new_mapping_fingerprint, member.new_body_fingerprint,
        uuid.UUID(member.new_pack_install_id),
        member.old_mapping_fingerprint, member.old_body_fingerprint,
        uuid.UUID(member.old_pack_install_id),
        member.expected_revalidation_operation_id,
        operator[0], operator[1],
    )  # fmt: skip
    return None if row is None else _link_state(row)
