"""Legacy-link adoption's writes (SPEC MIG-1): one page of `backfill apply`, in its own
transaction, and the columns of an adopted link.

A page takes the owner's pack lock (the active install must be the one planned
against), then every link key of the page in link-key order (one statement), then
reads the records, links, attempts and locator owners afresh, decides, and inserts one
`finalized` link (with its OPS-2 audit entry) per adoptable record. A page that fails
writes nothing, and every committed page stays: re-running adopts the rest, the pages
already done come back `already_adopted`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from db import audit as audit_q
from db import backfill as q
from db import link_batches as batches_q
from db import links as links_q
from db import packs as packs_q
from db import remote_deletions as deletions_q
from db.errors import RemoteLocatorClaimedError, invariant_errors
from db.records import Conn
from protocol.active import ActiveMetadata
from protocol.audit import AuditCommand, AuditEntry
from protocol.backfill import Prepared, decide_batch, lookups, prepare, record_keys
from protocol.backfill_facts import (
    BackfillSlot,
    Locator,
    Outcome,
    RecordDecision,
    RejectReason,
    StoredFacts,
)
from protocol.errors import MirrorStatus
from protocol.identity import ACTION_TYPE
from protocol.restore_rule import adoption_refusal
from protocol.states import LinkStatus
from services.patch.plan import validated_values


class ActivePackChanged(Exception):
    """The active install changed after the run started; the current page wrote nothing."""


@dataclass(frozen=True)
class AdoptSlot:
    backfill: BackfillSlot
    active: ActiveMetadata


async def stored_facts(conn: Conn, items: Sequence[Prepared]) -> StoredFacts:
    """The rows `protocol.backfill.lookups` names for these records."""
    wanted = lookups(items)
    return StoredFacts(
        links=tuple(await q.links_by_key(conn, wanted.link_keys)),
        attempts=tuple(await q.attempts_by_key(conn, wanted.link_keys)),
        locator_owners=tuple(await q.locator_owners(conn, wanted.locators)),
    )


async def apply_page(
    conn: Conn,
    pack_install_id: str,
    slot: AdoptSlot,
    record_ids: Sequence[str],
    claimed_twice: frozenset[Locator],
    stamp: tuple[datetime, str],
) -> list[RecordDecision]:
    """One transaction: locks in link-key order, a fresh re-plan, then the inserts."""
    bf = slot.backfill
    async with conn.transaction():
        await packs_q.lock_owner_key(conn, bf.connector_owner_key)
        current = await packs_q.select_active_install(conn, bf.connector_owner_key)
        if current is None or current.pack_install_id != pack_install_id:
            raise ActivePackChanged(f"active install is no longer {pack_install_id}")
        # Keys depend on record identity only, so they are known before the re-read.
        known = {rid: record_keys(bf, rid) for rid in record_ids}
        await batches_q.lock_link_keys(conn, sorted({k for _, _, ks in known.values() for k in ks}))
        fresh = await q.records_by_id(conn, bf.source_object, record_ids)
        items = prepare(((bf, r) for r in fresh), known)
        decided = await refuse_adoptions(
            conn, decide_batch(items, await stored_facts(conn, items), claimed_twice), slot
        )
        if not any(d.outcome is Outcome.ADOPTABLE for d in decided):
            return decided  # G-4 may have refused them all: nothing to freeze or write
        shared = adopted_slot_values(slot.active, slot.backfill, *stamp)
        if await _adopt_all(conn, slot, decided, stamp, shared):
            return [_adopted(d) for d in decided]
        return [await _adopt(conn, slot, d, stamp, shared) for d in decided]


async def refuse_adoptions(
    conn: Conn, decided: Sequence[RecordDecision], slot: AdoptSlot
) -> list[RecordDecision]:
    """G-4: when the link adopted for `slot` could not work under the active pack, each
    adoptable record is rejected instead, with the reason and the remedy; G-8: so is one
    whose remote object the remote reported deleted. Plan and apply alike; nothing is
    written for a rejected record."""
    refused = adoption_refusal(slot.active)
    if refused is not None:
        reason, detail = RejectReason.NOT_ADOPTABLE_UNDER_ACTIVE_PACK, refused.message()
        return [_rejected(d, reason, detail) if _adoptable(d) else d for d in decided]
    bf = slot.backfill
    target = slot.active.require()[1].target_object
    ids = sorted({d.remote_id for d in decided if _adoptable(d) and d.remote_id is not None})
    deleted = await deletions_q.deleted_ids(conn, target, bf.remote_scope, ids)
    return [
        _rejected(d, RejectReason.REMOTE_OBJECT_DELETED, _deleted_detail(target, d))
        if _adoptable(d) and d.remote_id in deleted
        else d
        for d in decided
    ]


def _adoptable(decision: RecordDecision) -> bool:
    return decision.outcome is Outcome.ADOPTABLE


def _rejected(decision: RecordDecision, reason: RejectReason, detail: str) -> RecordDecision:
    return decision.model_copy(
        update={"outcome": Outcome.REJECTED, "reason": reason, "detail": detail}
    )


def _deleted_detail(target: str, decision: RecordDecision) -> str:
    return (
        f"{target} {decision.remote_id} was reported deleted by the remote (G-8; "
        "`connector-push links show` lists the event): clear the record's mirror pair, "
        "then its next save creates anew"
    )


def _adopted(decision: RecordDecision) -> RecordDecision:
    if decision.outcome is not Outcome.ADOPTABLE:
        return decision
    return decision.model_copy(update={"outcome": Outcome.ADOPTED})


async def _adopt_all(
    conn: Conn,
    slot: AdoptSlot,
    decided: Sequence[RecordDecision],
    stamp: tuple[datetime, str],
    shared: dict[str, Any],
) -> bool:
    """Every adoptable record of the page in two statements (links, audit), in a
    savepoint; False, having written nothing, when a locator was claimed concurrently by
    another key: `_adopt` then decides record by record which one."""
    adoptable = [d for d in decided if d.outcome is Outcome.ADOPTABLE]
    rows = [adopted_link_values(d, shared) for d in adoptable]
    try:
        async with conn.transaction():
            with invariant_errors():
                await q.insert_links(conn, rows)
            await audit_q.append_many(conn, [_audit_entry(d, stamp[1]) for d in adoptable])
    except RemoteLocatorClaimedError:
        return False
    return True


async def _adopt(
    conn: Conn,
    slot: AdoptSlot,
    decision: RecordDecision,
    stamp: tuple[datetime, str],
    shared: dict[str, Any],
) -> RecordDecision:
    if decision.outcome is not Outcome.ADOPTABLE:
        return decision
    values = adopted_link_values(decision, shared)
    try:
        # A savepoint: a locator claimed concurrently by another key rejects this record only.
        async with conn.transaction():
            with invariant_errors():
                await links_q.insert_link(conn, values)
            await audit_q.append(conn, _audit_entry(decision, stamp[1]))
    except RemoteLocatorClaimedError:
        return decision.model_copy(
            update={
                "outcome": Outcome.REJECTED,
                "reason": RejectReason.REMOTE_ID_CLAIMED_TWICE,
                "detail": "another link claimed this remote id during apply",
            }
        )
    return _adopted(decision)


def _audit_entry(decision: RecordDecision, operator: str) -> AuditEntry:
    """OPS-2: an adoption creates the link; there was no link before it."""
    return AuditEntry(
        operator=operator,
        reason="legacy adoption from mirror fields (MIG-1)",
        command=AuditCommand.BACKFILL_APPLY,
        link_key=decision.link_key,
        arguments={"source_record_id": decision.record_id},
        state_before=None,
        state_after={"link_status": "finalized", "remote_id": decision.remote_id},
        outcome="link adopted",
    )


def adopted_link_values(decision: RecordDecision, shared: dict[str, Any]) -> dict[str, Any]:
    """Columns of a `finalized` link adopted from legacy fields (STO-1), frozen from the
    active install exactly as a runtime create would have frozen them: the slot's
    columns `shared` (`adopted_slot_values`, computed once for a page) and the record's."""
    assert decision.link_key and decision.remote_id, "only adoptable decisions"
    return {
        **shared,
        "link_key": decision.link_key,
        "source_record_id": decision.record_id,
        "remote_id": decision.remote_id,
        "last_operator_reason": (
            f"MIG-1 backfill: adopted from {decision.provenance_format} provenance"
            f" (slot {decision.via_slot})"
        ),
    }


def adopted_slot_values(
    active: ActiveMetadata, slot: BackfillSlot, now: datetime, operator: str
) -> dict[str, Any]:
    """The columns every link adopted for `slot` shares: the install's snapshots and
    fingerprints (a canonical hash each, so once per page, not once per record)."""
    validated = validated_values(active)
    install = uuid.UUID(validated.pop("last_validated_pack_install_id"))
    action = active.action_snapshot()
    return {
        "connector_owner_key": slot.connector_owner_key,
        "action_slot_id": slot.action_slot_id,
        "action_type": ACTION_TYPE,
        "source_object": slot.source_object,
        "destination_slot_id": slot.destination_slot_id,
        **validated,
        "created_pack_install_id": install,
        "last_validated_pack_install_id": install,
        "mirror_source_object": slot.source_object,
        "mirror_remote_id_field": action.mirror.remote_id_field,
        "mirror_provenance_field": action.mirror.provenance_field,
        "mapping_fingerprint": action.mapping_fingerprint,
        "body_fingerprint": action.body_fingerprint,
        "remote_scope": slot.remote_scope,
        "status": LinkStatus.FINALIZED.value,
        # Only a remote id held in the current pair is adoptable: the mirror already shows it.
        "mirror_status": MirrorStatus.WRITTEN.value,
        "last_operator": operator,
        "last_operator_at": now,
    }
