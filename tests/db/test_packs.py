"""Pack installs (PACK-1, ID-3, ID-6) against a real, migrated database."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from activities.packs import ApplyOutcome, apply_pack, get_active_pack
from db import packs as q
from db.records import Conn
from protocol.manifest import ManifestInvalid, parse_manifest

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
