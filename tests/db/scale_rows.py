"""Many rows at once (set-wise INSERT ... SELECT generate_series), then VACUUM ANALYZE as
autovacuum would leave a settled table: enough rows that the planner's choice between
an index and a full scan is the one it makes at scale (issue 34 item 4).

The shape of a real database: almost every link finalized, a few suspended or retired;
almost every attempt finalized, a few queued or parked; PATCHes mostly done; one audit
entry and one ingress receipt per link. Ages spread over 30 s per row back from now,
the newest row last. Triggers are off for the fill (`session_replication_role =
replica`): the rows are written in their final states, which the lifecycle guards only
reach step by step.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Final

import asyncpg

BIG_TABLES: Final = (
    "connector_remote_link",
    "connector_push_attempt",
    "connector_push_attempt_request",
    "connector_patch_dispatch",
    "connector_operator_audit",
    "ingress_receipt",
)

_KEY: Final = "'lk1_' || encode(sha256(convert_to({0} || g, 'UTF8')), 'hex')"
LINK_KEY: Final = _KEY.format("'link-'")
# Fingerprints and hashes as long as real ones, so a link row is as wide as at scale.
DIGEST: Final = "'sha256:' || encode(sha256(convert_to('digest-' || g, 'UTF8')), 'hex')"
ATTEMPT_KEY: Final = _KEY.format("'attempt-'")
# The `g`th row of `n` ($1) was written 30 s per row before the last: in time order.
AGE: Final = "now() - make_interval(secs => ($1 - g) * 30)"

# The install every row names (its manifest is not read by the statements planned here).
INSTALL: Final = """
INSERT INTO pack_install (pack_install_id, connector_owner_key, connector_namespace, manifest,
    manifest_digest)
VALUES ($1, 'owner-1', 'acme', '{}', 'sha256:0')
"""

LINKS: Final = f"""
INSERT INTO connector_remote_link (
    link_key, connector_owner_key, action_slot_id, action_type, source_object,
    source_record_id, destination_slot_id, connector_namespace, flow_developer_name,
    flow_action_name, target_object, profile_name, created_pack_install_id,
    last_validated_pack_install_id, credential_ref, endpoint_class, retry_policy_hash,
    profile_payload_hash, create_path_template, update_path_template, response_id_path,
    mapping_fingerprint, body_fingerprint, remote_id, remote_scope, status, suspend_reason,
    created_at, updated_at)
SELECT {LINK_KEY}, 'owner-1', 'action-1', 'PushToConnector', 'Contact', 'rec-' || g,
       'dest-1', 'acme', 'Push_Contact', 'Push', 'contacts', 'profile-1', $2, $2, 'vault:x',
       'rest', {DIGEST}, {DIGEST}, '/objects/contacts', '/objects/contacts/{{remoteId}}',
       '$.id', {DIGEST}, {DIGEST}, 'remote-' || g, 'scope-1',
       CASE WHEN g % 1000 = 0 THEN 'suspended_drift' WHEN g % 997 = 0 THEN 'retired'
            ELSE 'finalized' END,
       CASE WHEN g % 1000 = 0 THEN 'drift:endpoint' END, {AGE}, {AGE}
FROM generate_series(1, $1) g
"""

# Both rows of each attempt (migration 0350).
ATTEMPTS: Final = f"""
WITH attempt AS (
    INSERT INTO connector_push_attempt (
        link_key, connector_owner_key, action_slot_id, source_object, source_record_id,
        destination_slot_id, status, attempt_ordinal, remote_id, created_at, updated_at)
    SELECT {ATTEMPT_KEY}, 'owner-1', 'action-1', 'Contact', 'rec-a' || g, 'dest-1',
           CASE WHEN g % 300 = 0 THEN 'pending' WHEN g % 500 = 0 THEN 'terminal_failed'
                WHEN g % 700 = 0 THEN 'ambiguous_remote_effect' ELSE 'finalized' END,
           1, 'remote-a' || g, {AGE}, {AGE}
    FROM generate_series(1, $1) g
    RETURNING attempt_id
)
INSERT INTO connector_push_attempt_request (
    attempt_id, action_type, connector_namespace, flow_developer_name, flow_action_name,
    target_object, profile_name, pack_install_id, request_idempotency_key, request_snapshot,
    authority_snapshot)
SELECT attempt_id, 'PushToConnector', 'acme', 'Push_Contact', 'Push', 'contacts', 'profile-1',
       $2, 'idem-' || attempt_id, '{{}}', '{{}}'
FROM attempt
"""

PATCHES: Final = f"""
INSERT INTO connector_patch_dispatch (link_key, status, created_at, updated_at)
SELECT {LINK_KEY},
       CASE WHEN g % 400 = 0 THEN 'pending' WHEN g % 900 = 0 THEN 'ambiguous_remote_effect'
            ELSE 'succeeded' END, {AGE}, {AGE}
FROM generate_series(1, $1) g
"""

AUDIT: Final = f"""
INSERT INTO connector_operator_audit (operator, reason, command, link_key, outcome, recorded_at)
SELECT 'ops', 'bulk', 'revalidate-apply', {LINK_KEY}, 'applied', {AGE}
FROM generate_series(1, $1) g
"""

RECEIPTS: Final = f"""
INSERT INTO ingress_receipt (receipt_id, endpoint, request_id, payload, received_at)
SELECT 'rc-' || g, 'crm', 'rq-' || g, '{{}}', {AGE} FROM generate_series(1, $1) g
"""


def link_key_sql(g: int) -> str:
    """The SQL expression of the `g`th link's key (for a test that names one)."""
    return LINK_KEY.replace(" || g", f" || {g}")


async def fill(conn: asyncpg.Connection, n: int) -> None:
    """`n` rows in each of `BIG_TABLES`, then VACUUM ANALYZE of each."""
    install = uuid.uuid4()
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        # The test cluster commits asynchronously; VACUUM can mark a page all-visible (what
        # an index-only scan needs) only once the rows' commit is flushed, as it is here.
        await conn.execute("SET LOCAL synchronous_commit = on")
        await conn.execute(INSTALL, install)
        await conn.execute(LINKS, n, install)
        # The triggers that count links by state are off too: count them as migration 0160
        # counts the links present when it runs.
        await conn.execute(
            "INSERT INTO connector_link_state_count (status, n)"
            " SELECT status, count(*) FROM connector_remote_link GROUP BY status"
        )
        await conn.execute(ATTEMPTS, n, install)
        await conn.execute(PATCHES, n)
        await conn.execute(AUDIT, n)
        await conn.execute(RECEIPTS, n)
    for table in BIG_TABLES:
        await conn.execute(f"VACUUM ANALYZE {table}")


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)
