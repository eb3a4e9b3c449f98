"""Minimal valid rows for the db tests: every NOT NULL column, nothing more."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from enum import StrEnum

import asyncpg

from db.attempt_request import insert_attempts
from db.link_batches import lock_records
from protocol.states import LIFECYCLES

# lifecycle -> primary-key column of its table
KEY_COLUMN = {
    "link": "link_key",
    "attempt": "attempt_id",
    "patch": "patch_id",
    "event": "event_id",
}

_SNAPSHOTS = {
    "connector_namespace": "acme",
    "flow_developer_name": "Push_Contact",
    "flow_action_name": "Push",
    "target_object": "contacts",
    "profile_name": "hubspot-main",
}


def new_link_key() -> str:
    return "lk1_" + hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def _stable(link_key: str) -> dict[str, str]:
    return {
        "link_key": link_key,
        "connector_owner_key": "owner-1",
        "action_slot_id": "action-1",
        "action_type": "PushToConnector",
        "source_object": "Contact",
        "source_record_id": link_key[-12:],
        "destination_slot_id": "dest-1",
        **_SNAPSHOTS,
    }


async def _insert(conn: asyncpg.Connection, table: str, row: Mapping[str, object]) -> None:
    columns = ", ".join(row)
    params = ", ".join(f"${i}" for i in range(1, len(row) + 1))
    await conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({params})", *row.values())


def pack_document(*remote_properties: str) -> dict[str, object]:
    """A valid pack whose one action slot is the `_stable` link's, mapping `remote_properties`."""
    mappings = [{"sourceField": p.title(), "remoteProperty": p} for p in remote_properties]
    return {
        "connectorOwnerKey": "owner-1",
        "namespace": "acme",
        "actionSlots": [
            {
                "id": "action-1",
                "flowDeveloperName": "Push_Contact",
                "flowActionName": "Push",
                "flowVersion": "1",
                "sourceObject": "Contact",
                "destinationSlot": "dest-1",
                "createPath": "/crm/v3/objects/{target}",
                "updatePath": "/crm/v3/objects/{target}/{remoteId}",
                "responseIdPath": "$.id",
                "mirror": {"remoteIdField": "remote_id__c", "provenanceField": "prov__c"},
                "mappings": mappings,
            }
        ],
        "destinationSlots": [
            {"id": "dest-1", "targetObject": "contacts", "remoteScope": "portal-1",
             "profile": "hubspot-main"}
        ],
        "profiles": [
            {"name": "hubspot-main", "credentialRef": "env:HUBSPOT_TOKEN",
             "endpointClass": "rest", "baseUrl": "http://127.0.0.1:1",
             "retryPolicy": {"maxAttempts": 3, "initialIntervalMs": 100}}
        ],
    }  # fmt: skip


async def insert_pack_install(
    conn: asyncpg.Connection, manifest: Mapping[str, object] | None = None
) -> uuid.UUID:
    """An inactive install; `manifest` (e.g. `pack_document(...)`) or an empty object."""
    pack_install_id = uuid.uuid4()
    await _insert(
        conn,
        "pack_install",
        {
            "pack_install_id": pack_install_id,
            "connector_owner_key": f"owner-{pack_install_id.hex[:8]}",
            "connector_namespace": "acme",
            "manifest": json.dumps(manifest or {}),
            "manifest_digest": "sha256:0",
        },
    )
    return pack_install_id


async def insert_link(
    conn: asyncpg.Connection,
    pack_install_id: uuid.UUID,
    *,
    link_key: str | None = None,
    remote_id: str | None = None,
    status: str = "finalized",
    remote_scope: str = "portal-1",
    columns: Mapping[str, object] | None = None,
) -> str:
    link_key = link_key or new_link_key()
    row = {
        **_stable(link_key),
        **(columns or {}),
        "created_pack_install_id": pack_install_id,
        "last_validated_pack_install_id": pack_install_id,
        "credential_ref": "vault:hubspot",
        "endpoint_class": "rest",
        "retry_policy_hash": "rp1",
        "profile_payload_hash": "pp1",
        "create_path_template": "/crm/v3/objects/contacts",
        "update_path_template": "/crm/v3/objects/contacts/{remoteId}",
        "response_id_path": "$.id",
        "mapping_fingerprint": "mf1",
        "body_fingerprint": "bf1",
        "remote_id": remote_id or uuid.uuid4().hex,
        "remote_scope": remote_scope,
        "status": status,
    }
    await _insert(conn, "connector_remote_link", row)
    return link_key


async def insert_attempt(
    conn: asyncpg.Connection,
    pack_install_id: uuid.UUID,
    *,
    link_key: str,
    ordinal: int = 1,
    status: str = "pending",
    dispatch_lane: str | None = None,
    attempt_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """An attempt row for the `_stable` link, under its record's admission lock (G-2)."""
    async with conn.transaction():
        record = _stable(link_key)
        owner, obj, record_id = (
            record[c] for c in ("connector_owner_key", "source_object", "source_record_id")
        )
        await lock_records(conn, [(owner, obj, record_id)])
        return await insert_attempt_unlocked(
            conn,
            pack_install_id,
            link_key=link_key,
            ordinal=ordinal,
            status=status,
            dispatch_lane=dispatch_lane,
            attempt_id=attempt_id,
        )


async def insert_attempt_unlocked(
    conn: asyncpg.Connection,
    pack_install_id: uuid.UUID,
    *,
    link_key: str,
    ordinal: int = 1,
    status: str = "pending",
    dispatch_lane: str | None = None,
    attempt_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """The rows alone (the attempt's and its frozen request's, migration 0350): Postgres
    refuses them unless the caller holds the record's lock."""
    attempt_id = attempt_id or uuid.uuid4()
    row: dict[str, object] = {
        **_stable(link_key),
        "attempt_id": attempt_id,
        "pack_install_id": pack_install_id,
        "status": status,
        "attempt_ordinal": ordinal,
        "request_idempotency_key": f"idem-{attempt_id}",
        "request_snapshot": {"method": "POST", "path": "/crm/v3/objects/contacts"},
        "authority_snapshot": {"user_id": "u1", "allowed_fields": ["email"]},
    }
    if dispatch_lane is not None:
        row["dispatch_lane"] = dispatch_lane
        row["association_source_ids"] = ["", "acc-1"]
    await insert_attempts(conn, [row])
    return attempt_id


async def insert_patch(
    conn: asyncpg.Connection, *, link_key: str, status: str = "pending"
) -> uuid.UUID:
    patch_id = uuid.uuid4()
    await _insert(
        conn,
        "connector_patch_dispatch",
        {"patch_id": patch_id, "link_key": link_key, "status": status},
    )
    return patch_id


async def insert_event(conn: asyncpg.Connection, *, status: str = "admitted") -> str:
    event_id = f"ev1_{uuid.uuid4().hex}"
    await _insert(
        conn,
        "connector_event",
        {
            "event_id": event_id,
            "endpoint": "crm",
            "event_type": "contact.deletion",
            "handler": "remote_deletion",
            "payload": "{}",
            "first_receipt_id": f"rc1_{uuid.uuid4().hex}",
            "status": status,
            "status_reason": None if status == "admitted" else "test",
        },
    )
    return event_id


async def set_status(conn: asyncpg.Connection, lifecycle: str, key: object, status: str) -> str:
    """UPDATE one row's status; returns the command tag ("UPDATE 1")."""
    table = LIFECYCLES[lifecycle][0]
    column = KEY_COLUMN[lifecycle]
    if lifecycle == "event":  # a settled event carries its reason (table CHECK)
        return await conn.execute(
            f"UPDATE {table} SET status = $1, status_reason = CASE WHEN $1 = 'admitted' "
            f"THEN NULL ELSE 'test' END WHERE {column} = $2",
            status,
            key,
        )
    return await conn.execute(f"UPDATE {table} SET status = $1 WHERE {column} = $2", status, key)


def path_to(
    table: Mapping[StrEnum, frozenset[StrEnum]], initial: StrEnum, goal: StrEnum
) -> list[StrEnum]:
    """Shortest legal walk from `initial` to `goal` (excluding `initial`); BFS."""
    previous: dict[StrEnum, StrEnum | None] = {initial: None}
    queue = deque([initial])
    while queue:
        state = queue.popleft()
        for target in sorted(table[state]):
            if target not in previous:
                previous[target] = state
                queue.append(target)
    if goal not in previous:
        raise AssertionError(f"{goal} is unreachable from {initial}")
    walk: list[StrEnum] = []
    node: StrEnum | None = goal
    while node is not None and node != initial:
        walk.append(node)
        node = previous[node]
    return walk[::-1]


@asynccontextmanager
async def rows_from_before_0090(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """Write rows an older schema allowed: a create attempt for a key that already has a
    link, which migration 0090 refuses now. A database upgraded from before it may hold
    them, so revalidation's occupancy rule (REV-2) must still see them."""
    guard = "ALTER TABLE connector_push_attempt {} TRIGGER connector_push_attempt_linked_key_tg"
    await conn.execute(guard.format("DISABLE"))
    try:
        yield
    finally:
        await conn.execute(guard.format("ENABLE"))
