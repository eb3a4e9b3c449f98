"""Backfill adoption follows the per-link rules (SPEC §17 G-4, C-9) where it writes: a page
never inserts a link the active pack could not work with, whatever slot its caller hands
it; the records are rejected with the reason and the remedy, and nothing is written."""

from __future__ import annotations

import asyncpg

from protocol.active import resolve_active
from protocol.backfill_facts import Outcome, RejectReason
from services.backfill import apply_backfill, load_slots, plan_backfill
from services.backfill_adopt import AdoptSlot, apply_page
from services.packs import apply_pack
from tests.db.backfill_support import MARKER, NOW, PROV, RID, SLOT, demo, put, written


async def test_g4_a_page_refuses_to_adopt_under_a_slot_the_active_pack_lacks(
    db_pool: asyncpg.Pool,
) -> None:
    """G-4: a run planned against one install, whose slot the next apply recreated under a
    new id, hands a page the old slot (as a stale or a new caller could). The page rejects
    the record (`not_adoptable_under_active_pack`, naming the slot and the remedy) and
    writes nothing. Fails on the old main: the page froze the slot's snapshots from the
    active install regardless and failed on an assertion, with no reason or remedy."""
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        _, slots = await load_slots(conn, "demo-owner")
        stale = slots[SLOT]
        document = demo(id="push-contact-v2")
        for association in document["actionSlots"][1]["associations"]:
            association["targetActionSlot"] = "push-contact-v2"
        recreated = await apply_pack(conn, document)
        await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
        before = await written(conn)
        pack, _ = await load_slots(conn, "demo-owner")
        active = resolve_active(
            pack.manifest,
            recreated.pack_install_id,
            SLOT,
            stale.backfill.destination_slot_id,
        )
        slot = AdoptSlot(backfill=stale.backfill, active=active)
        [decision] = await apply_page(
            conn, recreated.pack_install_id, slot, ["c-1"], frozenset(), (NOW, "ops")
        )
        assert await written(conn) == before
    assert decision.outcome is Outcome.REJECTED
    assert decision.reason is RejectReason.NOT_ADOPTABLE_UNDER_ACTIVE_PACK
    assert f"action slot {SLOT!r} is not in the active install" in decision.detail
    assert "declared lineage" in decision.detail


async def test_g4_adoption_under_the_active_slot_still_adopts(db_pool: asyncpg.Pool) -> None:
    """G-4 refuses nothing a run of the active install adopts: a link born from the active
    install's snapshots has no finding."""
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
        report = await apply_backfill(conn, "demo-owner", [SLOT], now=NOW)
    assert [d.outcome for d in report.decisions] == [Outcome.ADOPTED]


async def test_g8_adoption_refuses_an_object_the_remote_reported_deleted(
    db_pool: asyncpg.Pool,
) -> None:
    """G-8: a legacy record whose mirror names an object the remote reported deleted (a
    recorded deletion event, kept whatever the link's state, and with no link) is not
    adopted, in plan and apply alike; the other record is."""
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
        await put(conn, "c-2", {RID: "r-2", PROV: MARKER})
        _, slots = await load_slots(conn, "demo-owner")
        scope = slots[SLOT].backfill.remote_scope
        await conn.execute(
            "INSERT INTO connector_remote_deletion (event_id, target_object, remote_scope,"
            " remote_id, event_type, endpoint) VALUES ('evt-1', 'contacts', $1, 'r-1',"
            " 'contact.deletion', 'hubspot')",
            scope,
        )
        planned = await plan_backfill(conn, "demo-owner", [SLOT])
        report = await apply_backfill(conn, "demo-owner", [SLOT], now=NOW)
    for decisions in (planned.decisions, report.decisions):
        by_record = {d.record_id: d for d in decisions}
        assert by_record["c-1"].outcome is Outcome.REJECTED
        assert by_record["c-1"].reason is RejectReason.REMOTE_OBJECT_DELETED
        assert "r-1 was reported deleted" in by_record["c-1"].detail
    assert {d.record_id: d.outcome for d in report.decisions}["c-2"] is Outcome.ADOPTED
