"""One creator per record and remote destination, decided by Postgres (SPEC G-2, GATE-1).

Issue 47's reproduction 1, at admission, with real concurrent connections: a pack with a
second action slot for `Contact` whose destination addresses the same remote scope and
target object, (a) on the same destination slot, (b) on a second destination slot with
the same scope and target. Saves of one record under both slots sent at once: exactly
one of each pair reserves a create, whatever the interleaving, in single admission, in
batch admission (batches lock in sorted order: no deadlock), and the other is refused
`prior_ownership_uncertain`. The pack itself is one `pack apply` now refuses (G-2);
`apply_legacy_pack` installs it as an install from before that check.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import asyncpg
import pytest

from db import link_batches as batch_q
from db.records import Conn
from protocol.admission import AdmissionDecision, CreateReserved, Rejected, SaveRequest
from protocol.errors import RejectReason
from protocol.installable import check_installable
from protocol.manifest import ManifestInvalid, parse_manifest
from services.admission import admit_all_locked, admit_save
from services.admission_facts import SaveToAdmit
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from tests.db import rows
from tests.db.batch_admission_support import (
    CONTACT_FIELDS,
    NOW,
    OWNER,
    apply_legacy_pack,
    items,
    pack,
)

RECORDS = 20
ROUNDS = 3


def two_creators(*, second_destination: bool, separate: bool = False) -> dict[str, Any]:
    """The demo pack with `push-contact-2`, a copy of `push-contact`: on `remote-contacts`
    itself (variant a) or on `remote-contacts-2`, the same scope and target (variant b)."""
    document = pack()
    slot = copy.deepcopy(document["actionSlots"][0])
    slot["id"] = "push-contact-2"
    if second_destination:
        [dest] = [d for d in document["destinationSlots"] if d["id"] == "remote-contacts"]
        document["destinationSlots"].append({**dest, "id": "remote-contacts-2"})
        slot["destinationSlot"] = "remote-contacts-2"
    document["actionSlots"].append(slot)
    if separate:
        document["separateOwnership"] = [
            {"actionSlots": ["push-contact", "push-contact-2"], "reason": "two contacts"}
        ]
    return document


def save(record_id: str, slot: str, destination: str) -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=slot,
        destination_slot_id=destination,
        source_object="Contact",
        source_record_id=record_id,
        originating_user_id="alice",
    )


async def seed_records(conn: Conn, ids: list[str]) -> None:
    records = [
        {"object": "Contact", "id": i, "fields": {"Email": f"{i}@x", "FirstName": "A"}} for i in ids
    ]
    grants = [{"user": "alice", "object": "Contact", "records": "*", "fields": CONTACT_FIELDS}]
    await load_records(conn, parse_records_document({"records": records, "grants": grants}))


def pairs(second_destination: bool, record_ids: list[str]) -> list[tuple[SaveRequest, ...]]:
    other = "remote-contacts-2" if second_destination else "remote-contacts"
    return [
        (save(r, "push-contact", "remote-contacts"), save(r, "push-contact-2", other))
        for r in record_ids
    ]


async def admit(pool: asyncpg.Pool, request: SaveRequest) -> AdmissionDecision:
    key = f"idem-{request.action_slot_id}-{request.source_record_id}"
    return await admit_save(pool, request, idempotency_key=key, locator_value=f"cp-{key}", now=NOW)


def creates(decisions: list[AdmissionDecision]) -> int:
    return sum(isinstance(d, CreateReserved) for d in decisions)


def assert_one_creator(decisions: list[AdmissionDecision]) -> None:
    assert creates(decisions) == 1, decisions
    [refused] = [d for d in decisions if not isinstance(d, CreateReserved)]
    assert isinstance(refused, Rejected), refused
    assert refused.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN, refused


async def reserved_records(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT source_record_id, count(*) AS n FROM connector_push_attempt"
        " GROUP BY source_record_id"
    )
    return {r["source_record_id"]: r["n"] for r in rows}


@pytest.mark.parametrize("second_destination", [False, True], ids=["one-dest-slot", "two"])
async def test_g2_saves_under_two_slots_at_once_reserve_one_create(
    db_pool: asyncpg.Pool, second_destination: bool
) -> None:
    """G-2, reproduction 1 (a) and (b): each record's two saves run at once on two
    connections, round after round; one create per record, never two."""
    async with db_pool.acquire() as conn:
        await apply_legacy_pack(conn, two_creators(second_destination=second_destination))
    for round_ in range(ROUNDS):
        ids = [f"c-{round_}-{n}" for n in range(RECORDS)]
        async with db_pool.acquire() as conn:
            await seed_records(conn, ids)
        for first, second in pairs(second_destination, ids):
            assert_one_creator(
                list(await asyncio.gather(admit(db_pool, first), admit(db_pool, second)))
            )
    assert set((await reserved_records(db_pool)).values()) == {1}


async def test_g2_two_destination_slots_one_after_the_other(db_pool: asyncpg.Pool) -> None:
    """G-2 (b): the gate compares remote destinations, not destination slot ids, so even
    one after the other the second slot's save is refused, naming the first's attempt."""
    async with db_pool.acquire() as conn:
        await apply_legacy_pack(conn, two_creators(second_destination=True))
        await seed_records(conn, ["c-seq"])
    [(first, second)] = pairs(True, ["c-seq"])
    assert isinstance(await admit(db_pool, first), CreateReserved)
    refused = await admit(db_pool, second)
    assert isinstance(refused, Rejected)
    assert refused.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN
    assert "'push-contact' at 'remote-contacts'" in refused.detail


async def admit_batch(pool: asyncpg.Pool, saves: list[SaveRequest]) -> list[AdmissionDecision]:
    batch = [
        SaveToAdmit(item.key, item.save, f"idem-{item.key}", f"cp-{item.key}")
        for item in items(saves)
    ]
    async with pool.acquire() as conn, conn.transaction():
        await batch_q.lock_link_keys(conn, [item.key for item in batch])
        return await admit_all_locked(conn, batch, NOW)


async def test_g2_batches_at_once_reserve_one_create_per_record(db_pool: asyncpg.Pool) -> None:
    """G-2 in batch admission: two batches, one per slot, their records in opposite
    orders, run at once: one create per record and no deadlock (records lock in order)."""
    async with db_pool.acquire() as conn:
        await apply_legacy_pack(conn, two_creators(second_destination=True))
    for round_ in range(ROUNDS):
        ids = [f"b-{round_}-{n}" for n in range(RECORDS)]
        async with db_pool.acquire() as conn:
            await seed_records(conn, ids)
        firsts, seconds = zip(*pairs(True, ids), strict=True)
        decided = await asyncio.wait_for(
            asyncio.gather(
                admit_batch(db_pool, list(firsts)), admit_batch(db_pool, list(reversed(seconds)))
            ),
            timeout=60,
        )
        by_record: dict[str, list[AdmissionDecision]] = {}
        for saves, decisions in zip((firsts, tuple(reversed(seconds))), decided, strict=True):
            for request, decision in zip(saves, decisions, strict=True):
                by_record.setdefault(request.source_record_id, []).append(decision)
        for decisions in by_record.values():
            assert_one_creator(decisions)
    assert set((await reserved_records(db_pool)).values()) == {1}


async def test_g2_slots_declared_separate_each_create(db_pool: asyncpg.Pool) -> None:
    """G-2: a pack that declares the two slots deliberately separate owners is accepted,
    and each slot reserves its own create for the record."""
    async with db_pool.acquire() as conn:
        await apply_pack(conn, two_creators(second_destination=True, separate=True))
        await seed_records(conn, ["c-both"])
    [(first, second)] = pairs(True, ["c-both"])
    decisions = await asyncio.gather(admit(db_pool, first), admit(db_pool, second))
    assert creates(list(decisions)) == 2, decisions


@pytest.mark.parametrize("second_destination", [False, True], ids=["one-dest-slot", "two"])
async def test_g2_apply_refuses_two_creators_at_one_destination(
    db_pool: asyncpg.Pool, second_destination: bool
) -> None:
    """G-2: `pack apply` names the two slots and refuses the pack; nothing is installed."""
    document = two_creators(second_destination=second_destination)
    with pytest.raises(ManifestInvalid) as refused:
        check_installable(parse_manifest(document))
    [problem] = refused.value.problems
    assert "'push-contact-2'" in problem and "'push-contact'" in problem
    assert "separateOwnership" in problem
    async with db_pool.acquire() as conn:
        with pytest.raises(ManifestInvalid):
            await apply_pack(conn, document)
        assert await conn.fetchval("SELECT count(*) FROM pack_install") == 0


async def test_g2_postgres_refuses_an_attempt_reserved_without_the_record_lock(
    conn: asyncpg.Connection,
) -> None:
    """G-2 by construction: a path that inserts an attempt row without taking its record's
    admission lock (as admission does, `db.link_batches.lock_records`) is refused by
    Postgres, in one statement or a batch; with the lock the same row goes in."""
    install = await rows.insert_pack_install(conn)
    key = rows.new_link_key()
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match=r"admission lock \(G-2\)"):
        async with conn.transaction():
            await rows.insert_attempt_unlocked(conn, install, link_key=key)
    assert await conn.fetchval("SELECT count(*) FROM connector_push_attempt") == 0
    await rows.insert_attempt(conn, install, link_key=key)  # takes the lock
    assert await conn.fetchval("SELECT count(*) FROM connector_push_attempt") == 1
