"""Set-wise batch admission (issue 12 P7; SPEC WF-2, GATE-1, GATE-2, PATCH-2, DRIFT-2, ID-6,
LANE-2): a batch decides and writes exactly what admitting its saves one by one would.

Each scenario runs the saves twice on the same state: one by one (`admit_locked`, one
key lock per save) in a transaction rolled back afterwards, then as one batch
(`lock_link_keys` + `admit_all_locked`). Decisions and every row admission writes must
match; the expected decision kinds are asserted too, so a loader bug shared by both
paths still fails. (The set-wise loader itself is in test_batch_loader.py.)
"""

from __future__ import annotations

from typing import Any

import asyncpg

from db import link_batches as batch_q
from db import links as links_q
from db.records import Conn
from protocol.admission import (
    AdmissionDecision,
    SaveRequest,
)
from services.admission import admit_all_locked, admit_locked
from services.admission_facts import SaveToAdmit
from services.packs import apply_pack
from tests.db.batch_admission_support import (
    NOW,
    apply_legacy_pack,
    company,
    contact,
    items,
    pack,
    seed,
)

# -- the two paths --------------------------------------------------------------------


class _Rollback(Exception):
    pass


async def written(conn: Conn) -> dict[str, list[dict[str, Any]]]:
    """Every row admission writes, without the ids and clocks the database picks."""
    queries = {
        "attempts": "SELECT link_key, attempt_ordinal, status, dispatch_lane, "
        "request_idempotency_key, request_snapshot, authority_snapshot, "
        "association_source_ids, writeback_snapshot, pack_install_id "
        "FROM connector_push_attempt JOIN connector_push_attempt_frozen USING (attempt_id) "
        "ORDER BY link_key, attempt_ordinal",
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
        await apply_legacy_pack(conn, pack(old_slot=True))
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
