"""The set-wise admission loader (issue 12 P7) against the one-save reads it replaced: it
reads the same context and record rows for every save of a batch, and the HTTP batch
entry locks and admits set-wise."""

from __future__ import annotations

import json

import asyncpg
import pytest

from db import links as links_q
from db import packs as packs_q
from db.records import Conn
from protocol.active import resolve_active
from protocol.admission import (
    AdmissionContext,
    AssociationTarget,
    LineageRow,
    PackSlots,
    RecordOwnershipRow,
    RecordView,
)
from protocol.gates import association_lookups
from protocol.states import AttemptStatus, LinkStatus
from services.admission_facts import SaveToAdmit, load_facts
from services.packs import get_active_pack
from services.record_store import PostgresRecordStore
from services.rows import attempt_summary, link_snapshot
from services.save_entry import admit_batch
from tests.db.batch_admission_support import NOW, OWNER, company, contact, items, seed

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
