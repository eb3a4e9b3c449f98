"""Legacy-link adoption (MIG-1) against a real database: plan, apply, admission afterwards, CLI."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from typer.testing import CliRunner, Result

from cli.main import app
from db import records as records_q
from db.records import Conn
from protocol.admission import CreateReserved, PatchQueued, SaveRequest
from protocol.backfill_facts import Outcome, RecordDecision, RejectReason
from protocol.identity import link_key
from services.admission import admit_save
from services.backfill import apply_backfill, plan_backfill
from services.packs import apply_pack

R = RejectReason

DEMO_PACK = Path(__file__).resolve().parents[2] / "examples" / "demo-pack.yaml"
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
OWNER, SLOT, DEST = "demo-owner", "push-contact", "remote-contacts"
RID, PROV = "remote_id__c", "remote_provenance__c"
MARKER = f"{OWNER}:{SLOT}:{DEST}"
USER = "alice"
CONTACT = {"Email": "ada@example.com", "FirstName": "Ada", "LastName": "Lovelace"}

Fields = dict[str, Any]


def demo(**slot_changes: Any) -> dict[str, Any]:
    """The demo pack; `slot_changes` override the push-contact slot's keys."""
    document = yaml.safe_load(DEMO_PACK.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    document = copy.deepcopy(document)
    document["actionSlots"][0].update(slot_changes)
    return document


LEGACY_PAIR = {"remoteIdField": "legacy_id__c", "provenanceField": "legacy_prov__c"}


def key_of(record_id: str, slot: str = SLOT) -> str:
    return link_key(OWNER, slot, "Contact", record_id, DEST)


async def put(conn: Conn, record_id: str, fields: Fields, *, deleted: bool = False) -> None:
    await records_q.upsert_record(
        conn, "Contact", record_id, {**CONTACT, **fields}, deleted=deleted
    )


async def grant(conn: Conn, *record_ids: str) -> None:
    await records_q.upsert_object_permission(conn, USER, "Contact", True)
    await records_q.insert_record_permissions(conn, USER, "Contact", list(record_ids))
    await records_q.insert_field_permissions(conn, USER, "Contact", sorted(CONTACT))


async def written(conn: Conn) -> tuple[Any, ...]:
    """Everything adoption could write: links, attempts, PATCHes, record versions."""
    return tuple(
        [
            await conn.fetchval("SELECT count(*) FROM connector_remote_link"),
            await conn.fetchval("SELECT count(*) FROM connector_push_attempt"),
            await conn.fetchval("SELECT count(*) FROM connector_patch_dispatch"),
            await conn.fetch("SELECT record_id, version FROM crm_record ORDER BY record_id"),
        ]
    )


def only(decisions: tuple[RecordDecision, ...], record_id: str) -> RecordDecision:
    [found] = [d for d in decisions if d.record_id == record_id and d.action_slot_id == SLOT]
    return found


async def save(pool: asyncpg.Pool, record_id: str) -> object:
    request = SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=SLOT,
        destination_slot_id=DEST,
        source_object="Contact",
        source_record_id=record_id,
        originating_user_id=USER,
    )
    return await admit_save(
        pool, request, idempotency_key=f"idem-{record_id}", locator_value=record_id, now=NOW
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


# -- the command -------------------------------------------------------------------------


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["backfill", *args])


def prepare(dsn: str, records: dict[str, Fields]) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await apply_pack(conn, demo())
            for record_id, fields in records.items():
                await put(conn, record_id, fields)
        finally:
            await conn.close()

    asyncio.run(go())


def link_rows(dsn: str) -> list[tuple[str, str]]:
    async def go() -> list[tuple[str, str]]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT link_key, remote_id FROM connector_remote_link")
            return [(r["link_key"], r["remote_id"]) for r in rows]
        finally:
            await conn.close()

    return asyncio.run(go())


def test_cli_plan_then_apply_exit_zero_and_report_per_record(db_dsn: str) -> None:
    prepare(db_dsn, {"c-1": {RID: "r-1", PROV: MARKER}})

    planned = run("plan", "--owner-key", OWNER, "--database-url", db_dsn)
    assert planned.exit_code == 0, planned.output
    assert "push-contact (Contact)" in planned.stdout and "adoptable" in planned.stdout
    assert f"{key_of('c-1')[:12]}…" in planned.stdout and "c-1" in planned.stdout
    assert link_rows(db_dsn) == []

    applied = run("apply", "--owner-key", OWNER, "--json", "--database-url", db_dsn)
    assert applied.exit_code == 0, applied.output
    report = json.loads(applied.stdout)
    assert report["mode"] == "apply" and report["totals"]["adopted"] == 1
    [record] = [r for r in report["records"] if r["record_id"] == "c-1"]
    assert (record["outcome"], record["link_key"]) == ("adopted", key_of("c-1"))
    assert link_rows(db_dsn) == [(key_of("c-1"), "r-1")]


def test_cli_exits_3_when_any_record_is_rejected_but_still_adopts_the_rest(db_dsn: str) -> None:
    prepare(db_dsn, {"c-1": {RID: "r-1", PROV: MARKER}, "c-2": {PROV: MARKER}})

    result = run("apply", "--owner-key", OWNER, "--action-slot", SLOT, "--database-url", db_dsn)

    assert result.exit_code == 3, result.output
    assert "provenance_without_remote_id" in result.stdout
    assert link_rows(db_dsn) == [(key_of("c-1"), "r-1")]


def test_cli_rejects_an_unknown_slot_or_owner_before_reading(db_dsn: str) -> None:
    prepare(db_dsn, {})
    unknown_slot = run(
        "plan", "--owner-key", OWNER, "--action-slot", "nope", "--database-url", db_dsn
    )
    no_pack = run("plan", "--owner-key", "nobody", "--database-url", db_dsn)
    assert (unknown_slot.exit_code, no_pack.exit_code) == (2, 2)
    assert "nope" in unknown_slot.output and "nobody" in no_pack.output


def test_cli_large_runs_page_through_every_record(db_dsn: str) -> None:
    records = {f"c-{i:03d}": {RID: f"r-{i}", PROV: MARKER} for i in range(120)}
    prepare(db_dsn, records)

    result = run(
        "apply", "--owner-key", OWNER, "--batch-size", "50", "--json", "--database-url", db_dsn
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    contacts = [r for r in report["records"] if r["action_slot_id"] == SLOT]
    assert len(contacts) == 120 and report["totals"]["adopted"] == 120
    assert len(link_rows(db_dsn)) == 120


class RecordingProgress:
    def __init__(self) -> None:
        self.total: int | None = None
        self.advanced: list[int] = []

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, records: int) -> None:
        self.advanced.append(records)


async def test_progress_counts_every_record_of_the_selected_slots_page_by_page(
    db_pool: asyncpg.Pool,
) -> None:
    progress = RecordingProgress()
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        for i in range(7):
            await put(conn, f"c-{i}", {})
        await records_q.upsert_record(conn, "Account", "a-1", {"Name": "Engines"})
        await plan_backfill(conn, OWNER, [SLOT], batch_size=3, progress=progress)
    assert (progress.total, progress.advanced) == (7, [3, 3, 1])
