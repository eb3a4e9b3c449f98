"""Set-wise batch admission (issue 12 P7; SPEC WF-2, GATE-1, GATE-2, PATCH-2, DRIFT-2, ID-6,
LANE-2): a batch decides and writes exactly what admitting its saves one by one would.

Each scenario runs the saves twice on the same state: one by one (`admit_locked`, one
key lock per save) in a transaction rolled back afterwards, then as one batch
(`lock_link_keys` + `admit_all_locked`). Decisions and every row admission writes must
match; the expected decision kinds are asserted too, so a loader bug shared by both
paths still fails.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from db import link_batches as batch_q
from db import links as links_q
from db import packs as packs_q
from db.records import Conn
from protocol.active import resolve_active
from protocol.admission import (
    AdmissionContext,
    AdmissionDecision,
    AssociationTarget,
    LineageRow,
    PackSlots,
    RecordOwnershipRow,
    RecordView,
    SaveRequest,
)
from protocol.gates import association_lookups
from protocol.identity import link_key
from protocol.revalidation_manifest import Approval
from protocol.states import AttemptStatus, LinkStatus
from services.admission import admit_all_locked, admit_locked
from services.admission_facts import SaveToAdmit, load_facts
from services.backfill import apply_backfill
from services.packs import apply_pack, get_active_pack
from services.record_loader import load_records, parse_records_document
from services.record_store import PostgresRecordStore
from services.revalidation_owner import OwnerOutcome, OwnerRequest, revalidate_owner
from services.rows import attempt_summary, link_snapshot
from services.save_entry import admit_batch

DEMO_PACK = Path(__file__).resolve().parents[2] / "examples" / "demo-pack.yaml"
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
OWNER = "demo-owner"
CONTACT_FIELDS = ["Email", "FirstName", "LastName", "Phone", "remote_id__c", "remote_provenance__c"]
ACCOUNT_FIELDS = ["Name", "Website", "PrimaryContactId", "remote_id__c", "remote_provenance__c"]
ADOPTED = {
    "remote_id__c": "r-linked",
    "remote_provenance__c": f"{OWNER}:push-contact:remote-contacts",  # MIG-1 evidence
}


def pack(*, old_slot: bool = False, rebind: bool = False, drift: bool = False) -> dict[str, Any]:
    """The demo pack; with an extra contact slot `push-contact-old`, or with that slot
    rebound into `push-contact` (ID-6), or with a mapping row added (fail-closed drift)."""
    document = copy.deepcopy(yaml.safe_load(DEMO_PACK.read_text(encoding="utf-8")))
    contact = document["actionSlots"][0]
    if old_slot:
        document["actionSlots"].append({**copy.deepcopy(contact), "id": "push-contact-old"})
    if rebind:
        document["lineage"] = [
            {"kind": "rebind", "fromSlot": "push-contact-old", "toSlot": "push-contact"}
        ]
    if drift:
        contact["mappings"].append({"sourceField": "Title", "remoteProperty": "jobtitle"})
    assert isinstance(document, dict)
    return document


def contact(record_id: str, *, slot: str = "push-contact", user: str = "alice") -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=slot,
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id=record_id,
        originating_user_id=user,
    )


def company(record_id: str) -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id="push-company",
        destination_slot_id="remote-companies",
        source_object="Account",
        source_record_id=record_id,
        originating_user_id="alice",
    )


def items(saves: list[SaveRequest]) -> list[SaveToAdmit]:
    return [
        SaveToAdmit(
            link_key(s.connector_owner_key, s.action_slot_id, s.source_object,
                     s.source_record_id, s.destination_slot_id),
            s,
            f"idem-{i}",
            f"cp-idem-{i}",
        )
        for i, s in enumerate(saves)
    ]  # fmt: skip


async def seed(conn: Conn) -> None:
    """Contacts new, adopted (a finalized link), unreadable, incomplete and deleted;
    companies naming an unlinked and a linked primary contact; a lineage attempt."""
    email = {"FirstName": "A", "LastName": "B"}
    records = [
        *({"object": "Contact", "id": f"c-new-{n}", "fields": {**email, "Email": f"{n}@x"}}
          for n in (1, 2)),
        {"object": "Contact", "id": "c-linked", "fields": {**email, "Email": "l@x", **ADOPTED}},
        {"object": "Contact", "id": "c-lineage", "fields": {**email, "Email": "g@x"}},
        {"object": "Contact", "id": "c-secret", "fields": {**email, "Email": "s@x"}},
        {"object": "Contact", "id": "c-noemail", "fields": email},
        {"object": "Contact", "id": "c-deleted", "fields": {**email, "Email": "d@x"},
         "deleted": True},
        {"object": "Account", "id": "a-waits",
         "fields": {"Name": "W", "PrimaryContactId": "c-new-1"}},
        {"object": "Account", "id": "a-linked",
         "fields": {"Name": "L", "PrimaryContactId": "c-linked"}},
    ]  # fmt: skip
    readable = ["c-new-1", "c-new-2", "c-linked", "c-lineage", "c-noemail", "c-deleted"]
    grants = [
        {"user": "alice", "object": "Contact", "records": readable, "fields": CONTACT_FIELDS},
        {"user": "bob", "object": "Contact", "records": readable, "fields": CONTACT_FIELDS},
        {"user": "alice", "object": "Account", "records": "*", "fields": ACCOUNT_FIELDS},
    ]
    await apply_pack(conn, pack())
    await load_records(conn, parse_records_document({"records": records, "grants": grants}))
    await apply_backfill(conn, OWNER, now=NOW)  # adopts c-linked: a finalized link (MIG-1)
    assert await conn.fetchval("SELECT count(*) FROM connector_remote_link") == 1
    await apply_pack(conn, pack(old_slot=True))
    [old] = items([contact("c-lineage", slot="push-contact-old")])
    async with conn.transaction():
        await links_q.lock_link_key(conn, old.key)
        await admit_locked(conn, old.key, old.save, "idem-old", "cp-idem-old", NOW)
    await apply_pack(conn, pack(rebind=True))
    await revalidate_owner_links(conn)


async def revalidate_owner_links(conn: Conn) -> None:
    """C-4: each apply is a new install, and the adopted link fails closed until the owner
    is revalidated (`connector-push revalidate owner`)."""
    approval = Approval(approved_by="op", approval_reference="CHG", reason="same mapping")
    request = OwnerRequest(connector_owner_key=OWNER, approval=approval)
    result = await revalidate_owner(conn, request, now=NOW)
    assert result.outcome is OwnerOutcome.APPLIED, result


# -- the two paths --------------------------------------------------------------------


class _Rollback(Exception):
    pass


async def written(conn: Conn) -> dict[str, list[dict[str, Any]]]:
    """Every row admission writes, without the ids and clocks the database picks."""
    queries = {
        "attempts": "SELECT link_key, attempt_ordinal, status, dispatch_lane, "
        "request_idempotency_key, request_snapshot, authority_snapshot, "
        "association_source_ids, writeback_snapshot, pack_install_id "
        "FROM connector_push_attempt ORDER BY link_key, attempt_ordinal",
        "patches": "SELECT link_key, status, originating_user_id, last_error "
        "FROM connector_patch_dispatch ORDER BY link_key, status",
        "links": "SELECT link_key, status, suspend_reason, drift_findings "
        "FROM connector_remote_link ORDER BY link_key",
    }
    return {name: [dict(r) for r in await conn.fetch(sql)] for name, sql in queries.items()}


def comparable(decision: AdmissionDecision) -> dict[str, Any]:
    """A decision as JSON, attempt ids (random per reservation) blanked."""
    dumped = decision.model_dump(mode="json")
    if "attempt_id" in dumped:
        dumped["attempt_id"] = "<attempt>"
    return dumped


async def one_by_one(conn: Conn, batch: list[SaveToAdmit]) -> tuple[list[Any], dict[str, Any]]:
    """Each save in its own admission, in order; everything rolled back afterwards."""
    result: tuple[list[Any], dict[str, Any]] = ([], {})
    try:
        async with conn.transaction():
            for item in batch:
                async with conn.transaction():
                    await links_q.lock_link_key(conn, item.key)
                    decision = await admit_locked(
                        conn, item.key, item.save, item.idempotency_key,
                        item.locator_value or "", NOW,
                    )  # fmt: skip
                result[0].append(comparable(decision))
            result = (result[0], await written(conn))
            raise _Rollback
    except _Rollback:
        pass
    return result


async def as_batch(conn: Conn, batch: list[SaveToAdmit]) -> tuple[list[Any], dict[str, Any]]:
    async with conn.transaction():
        await batch_q.lock_link_keys(conn, [item.key for item in batch])
        decisions = await admit_all_locked(conn, batch, NOW)
    return [comparable(d) for d in decisions], await written(conn)


async def both_paths(conn: Conn, saves: list[SaveRequest]) -> list[dict[str, Any]]:
    batch = items(saves)
    expected = await one_by_one(conn, batch)
    got = await as_batch(conn, batch)
    assert got[0] == expected[0]
    assert got[1] == expected[1]
    return got[0]


def kinds(decisions: list[dict[str, Any]]) -> list[str]:
    return [d["reason"] if d["kind"] == "rejected" else d["kind"] for d in decisions]


# -- scenarios ------------------------------------------------------------------------


async def test_a_varied_batch_decides_and_writes_as_one_by_one(db_pool: asyncpg.Pool) -> None:
    saves = [
        contact("c-new-1"),
        contact("c-linked"),
        contact("c-secret"),
        contact("c-noemail"),
        company("a-waits"),
        company("a-linked"),
        contact("c-deleted"),
        contact("c-new-1"),  # the same key again: sees the reservation above
        contact("c-lineage"),
        contact("c-linked", user="bob"),  # coalesces into the queued PATCH, bob's now
        contact("c-nowhere"),
        contact("c-new-2", slot="push-contact-old"),  # a retired slot: not trusted
        contact("c-new-2", user=""),  # no originating user
    ]
    async with db_pool.acquire() as conn:
        await seed(conn)
        decisions = await both_paths(conn, saves)
        rows = await written(conn)
    assert kinds(decisions) == [
        "create_reserved",
        "patch_queued",
        "record_unreadable",
        "required_field_missing",
        "deferred_association_reserved",
        "create_reserved",
        "source_deleted",
        "observed_active_attempt",
        # A pending create under the rebound old slot is still live: a second create here
        # could be a second object (GATE-1 + ID-6); retire it first.
        "prior_ownership_uncertain",
        "patch_queued",
        "source_not_found",  # c-nowhere never existed (issue 13); c-deleted was deleted
        "no_trusted_slot",
        "no_authority",
    ]
    linked = items([contact("c-linked")])[0].key
    assert [(p["link_key"], p["originating_user_id"]) for p in rows["patches"]] == [(linked, "bob")]
    assert decisions[5]["reservation"]["request"]["body"]["properties"]["primary_contact_id"] == (
        "r-linked"
    )
    assert decisions[7]["status"] == "pending"


async def test_drift_in_a_batch_suspends_once_and_later_saves_see_it(
    db_pool: asyncpg.Pool,
) -> None:
    """DRIFT-2 mid-batch: the link's second save finds it suspended, and a company whose
    primary contact it is waits for it (deferred lane) instead of resolving it."""
    async with db_pool.acquire() as conn:
        await seed(conn)
        await both_paths(conn, [contact("c-linked")])  # a PATCH queued before the drift
        await apply_pack(conn, pack(rebind=True, drift=True))
        saves = [contact("c-linked"), company("a-linked"), contact("c-linked", user="bob")]
        decisions = await both_paths(conn, saves)
        rows = await written(conn)
    assert kinds(decisions) == [
        "drift_fail_closed",
        "deferred_association_reserved",
        "link_suspended",
    ]
    linked = items([contact("c-linked")])[0].key
    assert [(link["link_key"], link["status"]) for link in rows["links"]] == [
        (linked, "suspended_drift")
    ]
    assert [p["status"] for p in rows["patches"]] == ["superseded"]


async def test_a_batch_of_one_key_many_times_reserves_once(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        await seed(conn)
        decisions = await both_paths(conn, [contact("c-new-2")] * 5)
        rows = await written(conn)
    assert kinds(decisions) == ["create_reserved"] + ["observed_active_attempt"] * 4
    key = items([contact("c-new-2")])[0].key
    assert [a["attempt_ordinal"] for a in rows["attempts"] if a["link_key"] == key] == [1]


async def test_prior_ownership_under_another_slot_is_seen_within_a_batch(
    db_pool: asyncpg.Pool,
) -> None:
    """GATE-1 (issue 15): with `push-contact-old` a live slot at the same destination and no
    lineage, a record owned under one slot is refused under the other, including an
    ownership the same batch reserved a moment earlier."""
    async with db_pool.acquire() as conn:
        await seed(conn)
        await apply_pack(conn, pack(old_slot=True))
        saves = [
            contact("c-new-1"),
            contact("c-new-1", slot="push-contact-old"),  # reserved just above, same batch
            contact("c-linked", slot="push-contact-old"),  # a finalized link + its mirror
            contact("c-lineage"),  # a pending attempt under push-contact-old
        ]
        decisions = await both_paths(conn, saves)
        rows = await written(conn)
    assert kinds(decisions) == ["create_reserved"] + ["prior_ownership_uncertain"] * 3
    assert items([contact("c-new-1")])[0].key in decisions[1]["detail"]
    assert "r-linked" in decisions[2]["detail"]
    assert "pending" in decisions[3]["detail"]
    # Nothing written for the refusals: only c-new-1's reservation is new.
    assert len(rows["attempts"]) == 2  # c-lineage's old attempt and c-new-1's


# -- the set-wise loader against the one-save reads it replaced -------------------------


async def reference_context(conn: Conn, item: SaveToAdmit) -> AdmissionContext:
    """The context as the one-save loader built it: one query per fact, one save."""
    save = item.save
    pack_ = await get_active_pack(conn, save.connector_owner_key)
    assert pack_ is not None
    active = resolve_active(
        pack_.manifest, pack_.pack_install_id, save.action_slot_id, save.destination_slot_id,
        install_ancestors=frozenset(pack_.ancestors),
    )  # fmt: skip
    store = PostgresRecordStore(conn)
    record = await store.read_record(save.source_object, save.source_record_id)
    view = RecordView(
        exists=record is not None and not record.deleted,
        deleted=record is not None and record.deleted,
        fields=record.fields if record is not None else {},
    )
    user = save.originating_user_id
    link_row = await links_q.link_by_key(conn, item.key)
    rebound = {
        r.from_slot
        for r in await packs_q.select_active_predecessors(conn, OWNER, save.action_slot_id)
        if r.kind == "rebind"
    }
    lineage = await links_q.lineage_rows(
        conn, OWNER, list(active.lineage_predecessors), save.source_object,
        save.source_record_id,
    )  # fmt: skip
    lookups = association_lookups(active, view) if active.usable else {}
    targets = await links_q.link_targets(conn, list(lookups.values()))
    return AdmissionContext(
        save=save,
        active=active,
        link=link_snapshot(link_row) if link_row is not None else None,
        attempts=tuple(attempt_summary(r) for r in await links_q.attempt_statuses(conn, item.key)),
        lineage_rows=tuple(
            LineageRow(
                slot_id=r["slot_id"],
                link_status=LinkStatus(r["link_status"]) if r["link_status"] else None,
                attempt_status=AttemptStatus(r["attempt_status"]) if r["attempt_status"] else None,
                rebound=r["slot_id"] in rebound,
            )
            for r in lineage
        ),
        record_rows=await reference_record_rows(conn, item),
        pack_slots=PackSlots.of(pack_.manifest),
        record=view,
        permissions=(
            await store.read_permissions(user, save.source_object, save.source_record_id)
            if user
            else None
        ),
        association_targets={
            cid: AssociationTarget(
                link_status=LinkStatus(targets[k]["status"]), remote_id=targets[k]["remote_id"]
            )
            if k in targets
            else AssociationTarget()
            for cid, k in lookups.items()
        },
        idempotency_key=item.idempotency_key,
        locator_value=item.locator_value,
        decided_at=NOW,
    )


async def reference_record_rows(conn: Conn, item: SaveToAdmit) -> tuple[RecordOwnershipRow, ...]:
    """GATE-1's rows as one query per table for one save: the record's links, then its
    attempts, under any other key, in key then ordinal order."""
    save = item.save
    where = (
        "connector_owner_key = $1 AND source_object = $2 AND source_record_id = $3 "
        "AND link_key <> $4"
    )
    args = (save.connector_owner_key, save.source_object, save.source_record_id, item.key)
    links = await conn.fetch(
        f"SELECT link_key, action_slot_id, destination_slot_id, status, remote_id "
        f"FROM connector_remote_link WHERE {where}",
        *args,
    )
    attempts = await conn.fetch(
        f"SELECT link_key, action_slot_id, destination_slot_id, status, attempt_ordinal "
        f"FROM connector_push_attempt WHERE {where}",
        *args,
    )
    rows = [
        (r["link_key"], 0, RecordOwnershipRow(
            link_key=r["link_key"], action_slot_id=r["action_slot_id"],
            destination_slot_id=r["destination_slot_id"],
            link_status=LinkStatus(r["status"]), remote_id=r["remote_id"],
        ))
        for r in links
    ] + [
        (r["link_key"], r["attempt_ordinal"], RecordOwnershipRow(
            link_key=r["link_key"], action_slot_id=r["action_slot_id"],
            destination_slot_id=r["destination_slot_id"],
            attempt_status=AttemptStatus(r["status"]),
        ))
        for r in attempts
    ]  # fmt: skip
    return tuple(r for _, _, r in sorted(rows, key=lambda x: (x[0], x[1])))


@pytest.mark.parametrize("set_wise", ["alone", "in_one_batch"])
async def test_the_set_wise_loader_reads_what_the_one_save_queries_read(
    db_pool: asyncpg.Pool, set_wise: str
) -> None:
    saves = [
        contact("c-new-1"),
        contact("c-linked"),
        contact("c-secret"),
        contact("c-lineage"),
        contact("c-deleted"),
        contact("c-nowhere"),
        company("a-waits"),
        company("a-linked"),
        contact("c-new-2", user=""),
    ]
    async with db_pool.acquire() as conn:
        await seed(conn)
        # A pending attempt under the old slot and a finalized link both count (ID-6).
        assert (await reference_context(conn, items([contact("c-lineage")])[0])).lineage_rows
        batch = items(saves)
        facts = await load_facts(conn, batch)
        for item in batch:
            if set_wise == "alone":
                facts = await load_facts(conn, [item])
            assert facts.context(item, NOW) == await reference_context(conn, item)


async def test_the_http_batch_entry_locks_and_admits_set_wise(db_pool: asyncpg.Pool) -> None:
    """`admit_batch` (the `POST /v1/saves/batch` path): decisions in request order."""
    async with db_pool.acquire() as conn:
        await seed(conn)
    saves = [contact("c-new-2"), contact("c-linked"), contact("c-new-2"), contact("bad\x00id")]
    outcome = await admit_batch(db_pool, saves, lambda ds: json.dumps([d.kind for d in ds]))
    assert json.loads(outcome.body) == [
        "create_reserved",
        "patch_queued",
        "observed_active_attempt",
        "rejected",
    ]
