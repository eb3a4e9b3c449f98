"""Shared by the PATCH-path e2e tests: a finalized contact, its PATCHes and suspension as
stored, the remote object, and the pack edits (each a drift surface) applied through
`pack apply`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx

from protocol.revalidation_manifest import Approval
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from services.revalidation_owner import OwnerOutcome, OwnerRequest, OwnerResult, revalidate_owner
from tests.e2e.conftest import OWNER, Stack, contact_key, demo_manifest
from tests.e2e.support import eventually

Doc = dict[str, Any]


async def finalized_contact(stack: Stack, record_id: str = "c-001") -> asyncpg.Record:
    await stack.push(record_id)
    await eventually(
        lambda: stack.attempt(contact_key(record_id)), lambda r: r["status"] == "finalized"
    )
    link = await stack.link(contact_key(record_id))
    assert link is not None
    return link


async def set_field(pool: asyncpg.Pool, obj: str, record_id: str, field: str, value: str) -> None:
    await pool.execute(
        "UPDATE crm_record SET fields = fields || jsonb_build_object($3::text, $4::text) "
        "WHERE source_object = $1 AND record_id = $2",
        obj,
        record_id,
        field,
        value,
    )


async def patches(stack: Stack, object_type: str = "contacts") -> list[Any]:
    return await stack.sandbox.ledger(object_type=object_type, kind="patch")


async def patch_rows(stack: Stack, key: str) -> list[asyncpg.Record]:
    return await stack.pool.fetch(
        "SELECT * FROM connector_patch_dispatch WHERE link_key = $1 ORDER BY created_at", key
    )


async def settled(stack: Stack, key: str) -> list[asyncpg.Record]:
    """Wait until no PATCH of the link is queued or in flight."""
    return await eventually(
        lambda: patch_rows(stack, key),
        lambda rows: bool(rows) and all(r["status"] not in ("pending", "processing") for r in rows),
    )


async def suspended(stack: Stack, key: str) -> asyncpg.Record | None:
    return await eventually(
        lambda: stack.link(key), lambda r: r is not None and r["status"] == "suspended_drift"
    )


async def remote_object(remote: BackgroundSandbox, object_type: str, remote_id: str) -> Doc:
    async with httpx.AsyncClient(base_url=remote.url) as http:
        response = await http.get(f"/crm/v3/objects/{object_type}/{remote_id}")
    body: Doc = response.json()
    return body


async def apply_edit(
    pool: asyncpg.Pool, remote: BackgroundSandbox, edit: Callable[[Doc], None], **kw: bool
) -> None:
    doc = demo_manifest(remote.url)
    edit(doc)
    async with pool.acquire() as conn:
        await apply_pack(conn, doc, **kw)


def contact_slot(doc: Doc) -> Doc:
    slot: Doc = doc["actionSlots"][0]  # type: ignore[index]
    return slot


def contact_profile(doc: Doc) -> Doc:
    profile: Doc = doc["profiles"][0]  # type: ignore[index]
    return profile


def reinstall(doc: Doc) -> None:
    del doc  # same manifest, new incarnation


def credential_ref(doc: Doc) -> None:
    contact_profile(doc)["credentialRef"] = "env:OTHER_TOKEN"


def endpoint_class(doc: Doc) -> None:
    contact_profile(doc)["endpointClass"] = "objects-api-v2"


def update_path(doc: Doc) -> None:
    contact_slot(doc)["updatePath"] = "/crm/v4/objects/{target}/{remoteId}"


def mapping_rows(doc: Doc) -> None:
    contact_slot(doc)["mappings"].append({"sourceField": "Title", "remoteProperty": "jobtitle"})


def target_new_slot(doc: Doc) -> None:
    doc["destinationSlots"][0]["id"] = "remote-people"  # type: ignore[index]
    doc["destinationSlots"][0]["targetObject"] = "people"  # type: ignore[index]
    contact_slot(doc)["destinationSlot"] = "remote-people"


def remote_scope(doc: Doc) -> None:
    doc["destinationSlots"][0]["remoteScope"] = "other-portal"  # type: ignore[index]


def base_url(doc: Doc) -> None:
    contact_profile(doc)["baseUrl"] = "http://127.0.0.1:9"


def flow_version(doc: Doc) -> None:
    contact_slot(doc)["flowVersion"] = "2"


def action_rename(doc: Doc) -> None:
    contact_slot(doc)["flowActionName"] = "Push_Person"


def retry_policy(doc: Doc) -> None:
    contact_profile(doc)["retryPolicy"] = {"maxAttempts": 9, "initialIntervalMs": 100}


async def revalidate_owner_now(pool: asyncpg.Pool) -> OwnerResult:
    """`connector-push revalidate owner` for the demo owner (C-4: after every new install)."""
    approval = Approval(approved_by="op", approval_reference="CHG-1", reason="new install")
    request = OwnerRequest(connector_owner_key=OWNER, approval=approval)
    async with pool.acquire() as conn:
        result = await revalidate_owner(conn, request, now=datetime.now(UTC))
    assert result.outcome is OwnerOutcome.APPLIED, result
    return result
