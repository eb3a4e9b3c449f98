"""`revalidate owner` against real Postgres (SPEC §15 C-4, §9): one command, one approval,
every link of the owner validated against its active install."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from protocol.active import resolve_active
from protocol.manifest import parse_manifest
from protocol.revalidation_manifest import Approval
from protocol.snapshots import ActionConfigSnapshot
from services import revalidation as revalidation_activity
from services import revalidation_owner
from services.packs import apply_pack
from services.patch.plan import validated_values
from services.revalidation_owner import OwnerOutcome, OwnerRequest, OwnerResult, revalidate_owner
from tests.db import rows

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
OWNER = "owner-1"
APPROVAL = Approval(approved_by="alice", approval_reference="CHG-30", reason="same mapping")


def fingerprints(document: dict[str, Any]) -> dict[str, object]:
    """The columns a link made under `document` carries for its action slot."""
    config = ActionConfigSnapshot.of(parse_manifest(document).action_slots[0])
    return {
        "mapping_fingerprint": config.mapping_fingerprint,
        "body_fingerprint": config.body_fingerprint,
    }


def upgraded(document: dict[str, Any]) -> dict[str, Any]:
    """The same pack with another retry policy: a new install, the mapping unchanged."""
    new = json.loads(json.dumps(document))
    new["profiles"][0]["retryPolicy"] = {"maxAttempts": 5, "initialIntervalMs": 100}
    return new


async def link(
    conn: asyncpg.Connection, install: uuid.UUID, fp: dict[str, object], slot: str = "action-1"
) -> str:
    """A finalized link under `install` carrying the fingerprints `fp`, frozen as a create
    under `install` freezes it (names, profile and paths: G-4 compares them)."""
    manifest = await conn.fetchval(
        "SELECT manifest FROM pack_install WHERE pack_install_id = $1", install
    )
    pack = parse_manifest(json.loads(manifest) if isinstance(manifest, str) else manifest)
    active = resolve_active(pack, str(install), pack.action_slots[0].id)
    frozen = validated_values(active)
    frozen["profile_snapshot"] = json.dumps(frozen["profile_snapshot"])
    del frozen["last_validated_pack_install_id"]
    key = await rows.insert_link(conn, install, columns={"action_slot_id": slot})
    columns = ", ".join(f"{name} = ${i}" for i, name in enumerate(frozen, start=2))
    await conn.execute(
        f"UPDATE connector_remote_link SET {columns} WHERE link_key = $1", key, *frozen.values()
    )
    await conn.execute(
        "UPDATE connector_remote_link SET mapping_fingerprint = $2, body_fingerprint = $3 "
        "WHERE link_key = $1",
        key,
        fp["mapping_fingerprint"],
        fp["body_fingerprint"],
    )
    return key


async def suspend(conn: asyncpg.Connection, key: str, *surfaces: str) -> None:
    findings = [{"surface": s, "disposition": "fail_closed", "detail": "x"} for s in surfaces]
    await conn.execute(
        "UPDATE connector_remote_link SET status = 'suspended_drift', suspend_reason = $2, "
        "drift_findings = $3::jsonb WHERE link_key = $1",
        key,
        f"drift:{surfaces[0]}",
        json.dumps(findings),
    )


async def run(conn: asyncpg.Connection, **kw: Any) -> OwnerResult:
    request = OwnerRequest(connector_owner_key=OWNER, approval=APPROVAL, **kw)
    return await revalidate_owner(conn, request, now=NOW)


async def test_one_command_moves_every_waiting_link_and_lifts_install_only_suspensions(
    db_pool: asyncpg.Pool,
) -> None:
    """C-4, P-10: after an upgrade, finalized links and links suspended for the install
    change alone all end finalized on the active install with a receipt each; a link also
    suspended for another surface (mapping) is left suspended; a retry writes nothing."""
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        install = uuid.UUID(first.pack_install_id)
        same = fingerprints(document)
        plain = await link(conn, install, same)
        upgraded_only = await link(conn, install, same)
        also_mapping = await link(conn, install, same)
        second = await apply_pack(conn, upgraded(document))
        assert second.links_awaiting_revalidation == 3
        await suspend(conn, upgraded_only, "pack_upgraded")
        await suspend(conn, also_mapping, "pack_upgraded", "mapping")
        result = await run(conn)
        links = {
            r["link_key"]: r
            for r in await conn.fetch(
                "SELECT link_key, status, last_validated_pack_install_id::text AS install "
                "FROM connector_remote_link"
            )
        }
        receipts = await conn.fetchval("SELECT count(*) FROM connector_link_revalidation_receipt")
        again = await run(conn)
        audit = await conn.fetch(
            "SELECT command, link_key FROM connector_operator_audit ORDER BY audit_id"
        )
    assert result.outcome is OwnerOutcome.APPLIED and result.mapping_moves == 0
    assert result.restored == (upgraded_only,) and result.restored_count == 1
    assert result.moved == 2 and receipts == 2
    for key in (plain, upgraded_only):
        assert (links[key]["status"], links[key]["install"]) == (
            "finalized",
            second.pack_install_id,
        )
    assert links[also_mapping]["status"] == "suspended_drift"
    assert again.outcome is OwnerOutcome.NOTHING_TO_DO and again.operations == ()
    assert [(a["command"], a["link_key"]) for a in audit] == [
        ("revalidate-owner", upgraded_only),
        *sorted(("revalidate-apply", k) for k in (plain, upgraded_only)),
    ]


async def test_a_mapping_move_is_refused_unless_asked_for(db_pool: asyncpg.Pool) -> None:
    """The one command is for an unchanged mapping: links whose fingerprints the install
    would move are refused with nothing written, and moved with --include-mapping-changes.
    A finalized link whose action slot the install lacks is skipped, not a failure."""
    document = rows.pack_document("email")
    wider = rows.pack_document("email", "phone")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        install = uuid.UUID(first.pack_install_id)
        key = await link(conn, install, fingerprints(document))
        await apply_pack(conn, wider)
        # (An apply suspends links of slots it removes, C-9: this one predates that.)
        other = await link(conn, install, fingerprints(document), slot="gone")
        before = await conn.fetchrow("SELECT * FROM connector_remote_link WHERE link_key = $1", key)
        refused = await run(conn)
        after = await conn.fetchrow("SELECT * FROM connector_remote_link WHERE link_key = $1", key)
        receipts = await conn.fetchval("SELECT count(*) FROM connector_link_revalidation_receipt")
        assert refused.outcome is OwnerOutcome.MAPPING_CHANGES and refused.mapping_moves == 1
        assert before == after and receipts == 0
        moved = await run(conn, include_mapping_changes=True)
        row = await conn.fetchrow("SELECT * FROM connector_remote_link WHERE link_key = $1", key)
    assert moved.outcome is OwnerOutcome.APPLIED and moved.moved == 1
    assert [r.link_key for r in moved.skipped] == [other]
    assert (
        row is not None and row["mapping_fingerprint"] == fingerprints(wider)["mapping_fingerprint"]
    )


async def test_any_count_goes_in_operations_of_a_bounded_size(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C-4 at any count (NF-7): links are read and moved a page at a time, one operation
    (and transaction) per page, so memory stays bounded; a re-run with
    the same operation id continues with fresh operation ids."""
    monkeypatch.setattr(revalidation_owner, "OWNER_CHUNK", 2)
    # A result lists its first SHOWN receipts only: the count of moved links is counted.
    monkeypatch.setattr(revalidation_activity, "SHOWN", 1)
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        install = uuid.UUID(first.pack_install_id)
        keys = [await link(conn, install, fingerprints(document)) for _ in range(5)]
        await apply_pack(conn, upgraded(document))
        result = await run(conn, operation_id="rev-owner")
        await apply_pack(conn, document)  # another install: all five wait again
        again = await run(conn, operation_id="rev-owner")
        receipts = await conn.fetch(
            "SELECT operation_id, count(*) AS n FROM connector_link_revalidation_receipt "
            "GROUP BY operation_id ORDER BY operation_id"
        )
    assert result.outcome is OwnerOutcome.APPLIED and result.moved == len(keys)
    assert result.operations == ("rev-owner.1", "rev-owner.2", "rev-owner.3")
    assert again.operations == ("rev-owner.4", "rev-owner.5", "rev-owner.6")
    assert [(r["operation_id"], r["n"]) for r in receipts] == [
        (f"rev-owner.{n}", 1 if n in (3, 6) else 2) for n in range(1, 7)
    ]
