"""Legacy-link adoption (MIG-1) against a real database: plan, apply, admission afterwards,
and every ambiguous case failing closed. (The command is in test_backfill_cli.py.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from db.records import Conn
from protocol.admission import CreateReserved, PatchQueued
from protocol.backfill_facts import Outcome, RejectReason
from services.backfill import apply_backfill, plan_backfill
from services.packs import apply_pack
from tests.db.backfill_support import (
    DEST,
    LEGACY_PAIR,
    MARKER,
    NOW,
    OWNER,
    PROV,
    RID,
    SLOT,
    Fields,
    R,
    demo,
    grant,
    key_of,
    only,
    put,
    save,
    written,
)

# -- adoption ------------------------------------------------------------------------


async def test_plan_writes_nothing_and_apply_adopts_so_the_next_save_patches(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
        await put(conn, "c-2", {})  # no evidence: the control that still creates
        await grant(conn, "c-1", "c-2")
        before = await written(conn)

        planned = await plan_backfill(conn, OWNER)
        assert await written(conn) == before
        assert only(planned.decisions, "c-1").outcome is Outcome.ADOPTABLE
        assert only(planned.decisions, "c-2").outcome is Outcome.SKIPPED

        applied = await apply_backfill(conn, OWNER, now=NOW)
        links = await conn.fetch("SELECT * FROM connector_remote_link")
    adopted = only(applied.decisions, "c-1")
    assert (adopted.outcome, adopted.link_key, adopted.remote_id) == (
        Outcome.ADOPTED,
        key_of("c-1"),
        "r-1",
    )
    [link] = links
    assert (link["link_key"], link["status"], link["remote_id"]) == (
        key_of("c-1"),
        "finalized",
        "r-1",
    )
    assert (link["remote_scope"], link["last_operator"]) == ("sandbox-portal", "backfill")

    assert isinstance(await save(db_pool, "c-1"), PatchQueued)  # no duplicate create
    assert isinstance(await save(db_pool, "c-2"), CreateReserved)


async def test_apply_twice_adopts_nothing_new(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        await put(conn, "c-1", {RID: "r-1", PROV: key_of("c-1")})  # the runtime's own format
        first = await apply_backfill(conn, OWNER, now=NOW)
        after_first = await written(conn)
        second = await apply_backfill(conn, OWNER, now=NOW)
        assert await written(conn) == after_first
        version = await conn.fetchval("SELECT row_version FROM connector_remote_link")
        # OPS-2: one audit entry for the one adoption, none for the idempotent re-run.
        trail = await conn.fetch("SELECT command, link_key FROM connector_operator_audit")
    assert [tuple(r) for r in trail] == [("backfill-apply", key_of("c-1"))]
    assert only(first.decisions, "c-1").outcome is Outcome.ADOPTED
    assert only(second.decisions, "c-1").outcome is Outcome.ALREADY_ADOPTED
    assert not second.rejected and version == 1


async def test_a_rebound_old_slot_marker_is_adopted_under_the_new_slot(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())  # declares push-contact-v0 -> push-contact
        await put(conn, "c-1", {RID: "r-1", PROV: f"{OWNER}:push-contact-v0:{DEST}"})
        report = await apply_backfill(conn, OWNER, now=NOW)
        keys = [
            r["link_key"] for r in await conn.fetch("SELECT link_key FROM connector_remote_link")
        ]
    decision = only(report.decisions, "c-1")
    assert (decision.outcome, decision.via_slot) == (Outcome.ADOPTED, "push-contact-v0")
    assert keys == [key_of("c-1")]


async def test_apply_adopts_the_unambiguous_and_reports_the_rest(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
        await put(conn, "c-2", {RID: "r-2"})
        report = await apply_backfill(conn, OWNER, now=NOW)
        count = await conn.fetchval("SELECT count(*) FROM connector_remote_link")
    assert report.rejected and count == 1
    assert only(report.decisions, "c-2").reason is RejectReason.REMOTE_ID_WITHOUT_PROVENANCE


async def test_locks_and_pages_do_not_hide_a_claim_across_pages(db_pool: asyncpg.Pool) -> None:
    """Two records on different pages claiming one remote id: neither is adopted."""
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
        await put(conn, "c-2", {RID: "r-1", PROV: MARKER})
        report = await apply_backfill(conn, OWNER, now=NOW, batch_size=1)
        count = await conn.fetchval("SELECT count(*) FROM connector_remote_link")
    assert count == 0
    for record_id in ("c-1", "c-2"):
        assert only(report.decisions, record_id).reason is RejectReason.REMOTE_ID_CLAIMED_TWICE


# -- every ambiguous case fails closed ------------------------------------------------------


async def _earlier_install_with_legacy_pair(conn: Conn) -> None:
    """An earlier install of the pack mirrored contacts into another field pair."""
    await apply_pack(conn, demo(mirror=LEGACY_PAIR))


async def _adopted(conn: Conn, record_id: str, remote_id: str) -> None:
    await put(conn, record_id, {RID: remote_id, PROV: MARKER})
    report = await apply_backfill(conn, OWNER, now=NOW)
    assert only(report.decisions, record_id).outcome is Outcome.ADOPTED


async def _attempt_reserved(pool: asyncpg.Pool, record_id: str) -> None:
    async with pool.acquire() as conn:
        await put(conn, record_id, {})
        await grant(conn, record_id)
    assert isinstance(await save(pool, record_id), CreateReserved)


async def _fields(conn: Conn, fields: Fields) -> None:
    await put(conn, "c-1", fields)


async def _two_records(conn: Conn) -> None:
    await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
    await put(conn, "c-2", {RID: "r-1", PROV: MARKER})


async def _claimed_by_link(conn: Conn) -> None:
    await _adopted(conn, "c-9", "r-1")
    await conn.execute("DELETE FROM crm_record WHERE record_id = 'c-9'")
    await put(conn, "c-1", {RID: "r-1", PROV: MARKER})


async def _other_remote_id(conn: Conn) -> None:
    await _adopted(conn, "c-1", "r-1")
    await put(conn, "c-1", {RID: "r-2"})


async def _deleted(conn: Conn) -> None:
    await put(conn, "c-1", {RID: "r-1", PROV: MARKER}, deleted=True)


Setup = Callable[[Conn], Awaitable[None]]


def _with(fields: Fields) -> Setup:
    return lambda conn: _fields(conn, fields)


# name -> (an earlier install mirrored into LEGACY_PAIR?, setup of c-1, expected reason)
AMBIGUOUS: dict[str, tuple[bool, Setup, RejectReason]] = {
    "provenance_only": (False, _with({PROV: MARKER}), R.PROVENANCE_WITHOUT_REMOTE_ID),
    "remote_id_only": (False, _with({RID: "r-1"}), R.REMOTE_ID_WITHOUT_PROVENANCE),
    "other_slot": (
        False,
        _with({RID: "r-1", PROV: f"{OWNER}:push-lead:{DEST}"}),
        R.PROVENANCE_FOR_OTHER_SLOT,
    ),
    "destination": (
        False,
        _with({RID: "r-1", PROV: f"{OWNER}:{SLOT}:remote-deals"}),
        R.DESTINATION_CHANGED,
    ),
    "outside": (
        True,
        _with({"legacy_id__c": "r-1", "legacy_prov__c": MARKER}),
        R.REMOTE_ID_OUTSIDE_CURRENT_FIELD_PAIR,
    ),
    "multiple": (
        True,
        _with({RID: "r-1", PROV: MARKER, "legacy_id__c": "r-2"}),
        R.MULTIPLE_CANDIDATE_REMOTE_IDS,
    ),
    "two_records": (False, _two_records, R.REMOTE_ID_CLAIMED_TWICE),
    "claimed_by_link": (False, _claimed_by_link, R.REMOTE_ID_CLAIMED_TWICE),
    "other_remote_id": (False, _other_remote_id, R.LINK_EXISTS_WITH_OTHER_REMOTE_ID),
    "deleted": (False, _deleted, R.SOURCE_DELETED),
    "unrecognized": (False, _with({RID: "r-1", PROV: "hubspot-sync"}), R.PROVENANCE_UNRECOGNIZED),
}


async def _case(pool: asyncpg.Pool, name: str) -> RejectReason:
    """Set up `c-1` so that it is ambiguous in the way `name` says; the expected reason."""
    if name == "attempt":
        async with pool.acquire() as conn:
            await apply_pack(conn, demo())
        await _attempt_reserved(pool, "c-1")
        async with pool.acquire() as conn:
            await put(conn, "c-1", {RID: "r-1", PROV: MARKER})
        return R.ATTEMPT_EXISTS
    earlier, setup, reason = AMBIGUOUS[name]
    async with pool.acquire() as conn:
        if earlier:
            await _earlier_install_with_legacy_pair(conn)
        await apply_pack(conn, demo())
        await setup(conn)
    return reason


@pytest.mark.parametrize("name", [*AMBIGUOUS, "attempt"])
async def test_an_ambiguous_record_is_rejected_with_its_reason_and_nothing_is_written(
    db_pool: asyncpg.Pool, name: str
) -> None:
    reason = await _case(db_pool, name)
    async with db_pool.acquire() as conn:
        before = await written(conn)
        planned = await plan_backfill(conn, OWNER)
        applied = await apply_backfill(conn, OWNER, now=NOW)
        assert await written(conn) == before
    for report in (planned, applied):
        decision = only(report.decisions, "c-1")
        assert (decision.outcome, decision.reason) == (Outcome.REJECTED, reason), decision
        assert report.rejected
