"""Pack installs (PACK-1, ID-3, ID-6) against a real, migrated database."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from db import packs as q
from db.records import Conn
from protocol.manifest import ManifestInvalid, parse_manifest
from protocol.snapshots import ProfileSnapshot
from services.pack_preview import preview_apply
from services.packs import (
    ApplyOutcome,
    apply_pack,
    get_active_pack,
    validate_create_paths,
)
from tests.db import rows

DEMO_PACK = Path(__file__).resolve().parents[2] / "examples" / "demo-pack.yaml"


@pytest.fixture
def manifest() -> dict[str, Any]:
    document = yaml.safe_load(DEMO_PACK.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def changed(document: dict[str, Any], **top: Any) -> dict[str, Any]:
    new = copy.deepcopy(document)
    new.update(top)
    return new


async def install_count(conn: Conn) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pack_install"))


async def test_first_apply_installs_an_active_pack_with_lineage(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    async with db_pool.acquire() as conn:
        result = await apply_pack(conn, manifest)
        active = await q.select_active_install(conn, "demo-owner")
        lineage = await q.select_lineage(conn, result.pack_install_id)
    assert result.outcome is ApplyOutcome.INSTALLED
    assert result.replaced_pack_install_id is None
    assert active is not None and active.pack_install_id == result.pack_install_id
    assert active.manifest_digest == result.manifest_digest
    assert active.connector_namespace == "demo"
    assert [(r.slot_type, r.kind, r.from_slot, r.to_slot) for r in lineage] == [
        ("action", "rebind", "push-contact-v0", "push-contact")
    ]


async def test_applying_the_same_manifest_twice_keeps_one_install(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, manifest)
        second = await apply_pack(conn, manifest)
        assert await install_count(conn) == 1
    assert second.outcome is ApplyOutcome.UNCHANGED
    assert (second.pack_install_id, second.manifest_digest) == (
        first.pack_install_id,
        first.manifest_digest,
    )


async def test_spelling_a_default_out_is_the_same_manifest(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    explicit = copy.deepcopy(manifest)
    explicit["actionSlots"][0]["bodyEnvelope"] = "properties"
    async with db_pool.acquire() as conn:
        await apply_pack(conn, manifest)
        again = await apply_pack(conn, explicit)
        assert await install_count(conn) == 1
    assert again.outcome is ApplyOutcome.UNCHANGED


async def test_changed_manifest_replaces_the_active_install(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    rebound = changed(
        manifest,
        namespace="demo-v2",
        lineage=[
            {"kind": "rebind", "fromSlot": "push-contact-v0", "toSlot": "push-contact"},
            {"kind": "retire", "fromSlot": "push-lead"},
        ],
    )
    async with db_pool.acquire() as conn:
        old = await apply_pack(conn, manifest)
        new = await apply_pack(conn, rebound)
        installs = await q.select_installs(conn, "demo-owner")
        old_lineage = await q.select_lineage(conn, old.pack_install_id)
        new_lineage = await q.select_lineage(conn, new.pack_install_id)
    assert new.outcome is ApplyOutcome.INSTALLED
    assert new.pack_install_id != old.pack_install_id
    assert new.replaced_pack_install_id == old.pack_install_id
    assert [(i.pack_install_id, i.active) for i in installs] == [
        (old.pack_install_id, False),
        (new.pack_install_id, True),
    ]
    assert installs[0].deactivated_at is not None and installs[1].deactivated_at is None
    assert len(old_lineage) == 1
    assert {(r.kind, r.from_slot, r.to_slot) for r in new_lineage} == {
        ("rebind", "push-contact-v0", "push-contact"),
        ("retire", "push-lead", None),
    }


async def test_active_pack_round_trips_the_manifest(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    async with db_pool.acquire() as conn:
        result = await apply_pack(conn, manifest)
        active = await get_active_pack(conn, "demo-owner")
        missing = await get_active_pack(conn, "nobody")
    assert missing is None
    assert active is not None
    assert active.pack_install_id == result.pack_install_id
    assert active.manifest == parse_manifest(manifest)
    assert [r.from_slot for r in active.lineage] == ["push-contact-v0"]


async def test_predecessors_follow_rebind_chains_of_the_active_install(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    chained = changed(
        manifest,
        lineage=[
            {"kind": "rebind", "fromSlot": "contact-v1", "toSlot": "push-contact"},
            {"kind": "rebind", "fromSlot": "contact-v0", "toSlot": "contact-v1"},
            {"kind": "retire", "fromSlot": "push-lead"},
        ],
    )
    async with db_pool.acquire() as conn:
        await apply_pack(conn, manifest)
        await apply_pack(conn, chained)
        found = await q.select_active_predecessors(conn, "demo-owner", "push-contact")
        none = await q.select_active_predecessors(conn, "demo-owner", "push-company")
    # Only the active install counts: the first install's push-contact-v0 is history.
    assert [(r.from_slot, r.to_slot) for r in found] == [
        ("contact-v0", "contact-v1"),
        ("contact-v1", "push-contact"),
    ]
    assert none == []


async def test_invalid_manifest_writes_nothing(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    broken = copy.deepcopy(manifest)
    del broken["profiles"][0]["credentialRef"]
    async with db_pool.acquire() as conn:
        with pytest.raises(ManifestInvalid, match=r"profiles\[0\]\.credentialRef"):
            await apply_pack(conn, broken)
        assert await install_count(conn) == 0


async def test_owner_keys_are_installed_independently(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, manifest)
        await apply_pack(conn, changed(manifest, connectorOwnerKey="other-owner"))
        assert await q.select_active_owner_keys(conn) == ["demo-owner", "other-owner"]


async def test_concurrent_applies_leave_exactly_one_active_install(
    db_pool: asyncpg.Pool, manifest: dict[str, Any]
) -> None:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, manifest)

    async def apply(namespace: str) -> None:
        async with db_pool.acquire() as conn:
            await apply_pack(conn, changed(manifest, namespace=namespace))

    await asyncio.gather(*(apply(f"ns-{i}") for i in range(4)))
    async with db_pool.acquire() as conn:
        installs = await q.select_installs(conn, "demo-owner")
    assert len(installs) == 5
    assert sum(i.active for i in installs) == 1


# -- install changes fail closed (issue 30 item 4) -------------------------------------


def _recreated(document: dict[str, Any], slot_id: str) -> dict[str, Any]:
    new = copy.deepcopy(document)
    new["actionSlots"][0]["id"] = slot_id
    return new


async def test_an_apply_that_removes_an_action_slot_suspends_its_finalized_links(
    db_pool: asyncpg.Pool,
) -> None:
    """D-03L, C-9: the action slot is recreated under a new id (no lineage): the finalized
    link under the old slot is `suspended_drift` at that apply (its queued PATCH closed),
    not at its next save; a link under the kept slot and a retired one are untouched. The
    result and the CLI say how many. Fails on the old main: the link stayed finalized."""
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        install = uuid.UUID(first.pack_install_id)
        old = await rows.insert_link(conn, install)
        queued = await rows.insert_patch(conn, link_key=old)
        kept = await rows.insert_link(conn, install, columns={"action_slot_id": "action-2"})
        retired = await rows.insert_link(conn, install)
        await rows.set_status(conn, "link", retired, "retired")
        result = await apply_pack(conn, _recreated(document, "action-2"))
        links = {
            r["link_key"]: r
            for r in await conn.fetch("SELECT * FROM connector_remote_link ORDER BY link_key")
        }
        patch_status = await conn.fetchval(
            "SELECT status FROM connector_patch_dispatch WHERE patch_id = $1", queued
        )
    assert result.links_suspended_slot_removed == 1 and result.suspended_examples == (old,)
    assert links[old]["status"] == "suspended_drift"
    assert links[old]["suspend_reason"] == "drift:action_recreated"
    (finding,) = json.loads(links[old]["drift_findings"])
    assert (finding["surface"], finding["disposition"]) == ("action_recreated", "fail_closed")
    assert finding["detail"] == f"action slot 'action-1' is not in install {result.pack_install_id}"
    assert patch_status == "superseded"
    assert links[kept]["status"] == "finalized" and links[retired]["status"] == "retired"
    # C-4: the kept link is finalized but validated under the old install: it waits.
    assert result.links_awaiting_revalidation == 1
    assert result.revalidate_command is not None
    assert "revalidate owner --owner-key owner-1" in result.revalidate_command


async def test_a_create_path_change_is_recorded_until_validated(db_pool: asyncpg.Pool) -> None:
    """C-8 bookkeeping: an apply that changes a kept slot's createPath blocks it (the active
    install read carries the slot); validating it is audited and lifts the block; a later
    change blocks it again."""
    document = rows.pack_document("email")
    new_path = copy.deepcopy(document)
    new_path["actionSlots"][0]["createPath"] = "/crm/v4/objects/{target}"
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        assert first.create_paths_awaiting_validation == ()
        result = await apply_pack(conn, new_path)
        active = await get_active_pack(conn, "owner-1")
        blocks = await q.create_path_blocks(conn, "owner-1")
        validated = await validate_create_paths(conn, "owner-1", None, "ops", "checked")
        after = await get_active_pack(conn, "owner-1")
        audit = await conn.fetch(
            "SELECT command, operator, state_before, state_after FROM connector_operator_audit"
        )
        again = await apply_pack(conn, document)
        blocked_again = await get_active_pack(conn, "owner-1")
    assert result.create_paths_awaiting_validation == ("action-1",)
    assert active is not None and active.create_blocked == frozenset({"action-1"})
    assert [(b.action_slot_id, b.create_path_template, b.previous_create_path) for b in blocks] == [
        ("action-1", "/crm/v4/objects/{target}", "/crm/v3/objects/{target}")
    ]
    assert [b.action_slot_id for b in validated] == ["action-1"]
    assert after is not None and after.create_blocked == frozenset()
    assert [(a["command"], a["operator"]) for a in audit] == [("revalidate-create-path", "ops")]
    assert json.loads(audit[0]["state_after"])["validated"] is True
    assert again.create_paths_awaiting_validation == ("action-1",)
    assert blocked_again is not None and blocked_again.create_blocked == frozenset({"action-1"})


async def test_dry_run_writes_nothing(db_pool: asyncpg.Pool) -> None:
    """C-4: `preview_apply` reads what a new install would do (a removed slot: its links
    fail closed) and writes nothing: every table's rows are as they were."""
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        profile = ProfileSnapshot.of(parse_manifest(document).profiles[0])
        snapshot = {
            "profile_snapshot": json.dumps(profile.model_dump(mode="json")),
            "mirror_source_object": "Contact",
            "mirror_remote_id_field": "remote_id__c",
            "mirror_provenance_field": "prov__c",
        }
        link = await rows.insert_link(conn, uuid.UUID(first.pack_install_id), columns=snapshot)
        before = await _dump(conn)
        preview = await preview_apply(conn, _recreated(document, "action-2"))
        assert await _dump(conn) == before
    impacts = {(i.surface, i.subject): i for i in preview.impacts}
    gone = impacts[("action_recreated", "links")]
    assert (gone.effect.value, gone.count, gone.examples) == ("fail closed", 1, (link,))
    assert preview.links_failing_closed == 1 and not preview.unchanged


async def _dump(conn: Conn) -> list[Any]:
    tables = (
        "pack_install", "pack_slot_lineage", "connector_remote_link", "connector_patch_dispatch",
        "connector_push_attempt", "connector_operator_audit", "action_slot_create_path",
    )  # fmt: skip
    return [
        await conn.fetch(f"SELECT to_jsonb(t)::text AS r FROM {table} t ORDER BY 1")
        for table in tables
    ]
