"""Legacy-link adoption (SPEC MIG-1): `plan` reads, `apply` re-plans under locks and inserts.

Both walk every record of the selected action slots' source objects in pages
and let `protocol.backfill` decide each one. `plan` writes nothing. `apply`
runs one transaction per page: the owner's pack lock (the active install must
be the one planned against), then every link key of the page in link-key
order, then a fresh read of the records and of the stored links, attempts and
locator owners, then the decision, then one `finalized` link per adoptable
record. It never touches attempts or local records and makes no remote call:
adoption never POSTs. Re-running it finds the links and adopts nothing new.

Locators claimed by two records are found by a read-only pass over every slot
of the pack first, so a contested remote id is rejected whichever page (or
`--action-slot` selection) holds its claimants.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from db import audit as audit_q
from db import backfill as q
from db import links as links_q
from db import packs as packs_q
from db.errors import RemoteLocatorClaimedError, invariant_errors
from db.records import Conn
from protocol.active import ActiveMetadata, resolve_active
from protocol.audit import AuditCommand, AuditEntry
from protocol.backfill import Totals, decide_batch, lookups, totals
from protocol.backfill_defaults import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
from protocol.backfill_defaults import DEFAULT_OPERATOR as DEFAULT_OPERATOR
from protocol.backfill_evidence import claims, contested
from protocol.backfill_facts import (
    BackfillSlot,
    LegacyRecord,
    Locator,
    Outcome,
    RecordDecision,
    RejectReason,
    StoredFacts,
    backfill_slot,
)
from protocol.errors import MirrorStatus
from protocol.identity import ACTION_TYPE
from protocol.manifest import PackManifest, parse_manifest
from protocol.states import LinkStatus
from services.packs import ActivePack, get_active_pack
from services.patch import validated_values


class BackfillUnavailable(Exception):
    """Nothing to plan against: no active pack, or an unknown action slot (nothing read)."""


class ActivePackChanged(Exception):
    """The active install changed after the run started; the current page wrote nothing."""


class ProgressSink(Protocol):
    def start(self, total: int) -> None:
        """`total` records will be looked at."""

    def advance(self, records: int) -> None:
        """`records` more were decided."""


class BackfillReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    connector_owner_key: str
    pack_install_id: str
    applied: bool
    action_slots: tuple[str, ...]
    decisions: tuple[RecordDecision, ...]

    @property
    def totals(self) -> Totals:
        return totals(self.decisions)

    @property
    def rejected(self) -> bool:
        return any(d.outcome is Outcome.REJECTED for d in self.decisions)


@dataclass(frozen=True)
class _Slot:
    backfill: BackfillSlot
    active: ActiveMetadata


async def plan_backfill(
    conn: Conn,
    owner_key: str,
    action_slots: Sequence[str] = (),
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: ProgressSink | None = None,
) -> BackfillReport:
    """What `apply` would do now, per record; reads only."""
    return await _run(conn, owner_key, action_slots, batch_size, progress, apply_at=None)


async def apply_backfill(
    conn: Conn,
    owner_key: str,
    action_slots: Sequence[str] = (),
    *,
    now: datetime,
    operator: str = DEFAULT_OPERATOR,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: ProgressSink | None = None,
) -> BackfillReport:
    """Adopt every unambiguous record (one transaction per page); idempotent.

    `now` and `operator` stamp the adopted links' operator columns (who and when).
    Raises `ActivePackChanged` if a pack apply lands mid-run (earlier pages stay adopted).
    """
    return await _run(conn, owner_key, action_slots, batch_size, progress, (now, operator))


async def _run(
    conn: Conn,
    owner_key: str,
    selection: Sequence[str],
    batch_size: int,
    progress: ProgressSink | None,
    apply_at: tuple[datetime, str] | None,
) -> BackfillReport:
    pack, slots = await load_slots(conn, owner_key)
    chosen = _select(slots, selection)
    claimed_twice = await _contested(conn, slots.values(), batch_size)
    if progress is not None:
        objects = [s.backfill.source_object for s in chosen]
        progress.start(sum([await q.count_records(conn, [o]) for o in objects]))
    decisions: list[RecordDecision] = []
    for slot in chosen:
        async for page in _pages(conn, slot.backfill.source_object, batch_size):
            if apply_at is None:
                facts = await _facts(conn, [(slot.backfill, r) for r in page])
                decided = decide_batch([(slot.backfill, r) for r in page], facts, claimed_twice)
            else:
                decided = tuple(await _apply_page(conn, pack, slot, page, claimed_twice, apply_at))
            decisions.extend(decided)
            if progress is not None:
                progress.advance(len(page))
    return BackfillReport(
        connector_owner_key=owner_key,
        pack_install_id=pack.pack_install_id,
        applied=apply_at is not None,
        action_slots=tuple(s.backfill.action_slot_id for s in chosen),
        decisions=tuple(decisions),
    )


async def load_slots(conn: Conn, owner_key: str) -> tuple[ActivePack, dict[str, _Slot]]:
    """The active install and every action slot of it, with earlier installs' mirror pairs."""
    pack = await get_active_pack(conn, owner_key)
    if pack is None:
        raise BackfillUnavailable(f"owner key {owner_key!r} has no active pack install")
    stored = await q.install_manifests(conn, pack.ancestors)
    earlier = [_manifest(stored[i]) for i in pack.ancestors if i in stored]
    slots: dict[str, _Slot] = {}
    for action in pack.manifest.action_slots:
        active = resolve_active(
            pack.manifest,
            pack.pack_install_id,
            action.id,
            install_ancestors=frozenset(pack.ancestors),
        )
        slots[action.id] = _Slot(
            backfill=backfill_slot(pack.manifest, active, earlier), active=active
        )
    return pack, slots


def _manifest(document: object) -> PackManifest:
    assert isinstance(document, dict), "pack_install.manifest is a JSON object"
    return parse_manifest(document)


def _select(slots: dict[str, _Slot], selection: Sequence[str]) -> list[_Slot]:
    unknown = sorted(set(selection) - set(slots))
    if unknown:
        raise BackfillUnavailable(f"not an action slot of the active pack: {unknown}")
    return [slots[s] for s in sorted(set(selection) or slots)]


async def _pages(conn: Conn, source_object: str, size: int) -> AsyncIterator[list[LegacyRecord]]:
    after: str | None = None
    while page := await q.record_page(conn, source_object, after, size):
        yield page
        after = page[-1].record_id


async def _contested(conn: Conn, slots: Iterable[_Slot], size: int) -> frozenset[Locator]:
    """Locators claimed by more than one (slot, record) anywhere in the pack (read-only)."""
    items: list[tuple[BackfillSlot, LegacyRecord]] = []
    for slot in slots:
        async for page in _pages(conn, slot.backfill.source_object, size):
            # Only records holding a remote id can claim; keep nothing else in memory.
            items.extend((slot.backfill, r) for r in page if claims(slot.backfill, r))
    return contested(items)


async def _facts(conn: Conn, items: Sequence[tuple[BackfillSlot, LegacyRecord]]) -> StoredFacts:
    wanted = lookups(items)
    return StoredFacts(
        links=tuple(await q.links_by_key(conn, wanted.link_keys)),
        attempts=tuple(await q.attempts_by_key(conn, wanted.link_keys)),
        locator_owners=tuple(await q.locator_owners(conn, wanted.locators)),
    )


async def _apply_page(
    conn: Conn,
    pack: ActivePack,
    slot: _Slot,
    page: Sequence[LegacyRecord],
    claimed_twice: frozenset[Locator],
    stamp: tuple[datetime, str],
) -> list[RecordDecision]:
    """One transaction: locks in link-key order, a fresh re-plan, then the inserts."""
    bf = slot.backfill
    async with conn.transaction():
        await packs_q.lock_owner_key(conn, bf.connector_owner_key)
        current = await packs_q.select_active_install(conn, bf.connector_owner_key)
        if current is None or current.pack_install_id != pack.pack_install_id:
            raise ActivePackChanged(f"active install is no longer {pack.pack_install_id}")
        # Keys depend on record identity only, so they are known before the re-read.
        for key in lookups([(bf, r) for r in page]).link_keys:
            await links_q.lock_link_key(conn, key)
        fresh = await q.records_by_id(conn, bf.source_object, [r.record_id for r in page])
        items = [(bf, r) for r in fresh]
        decided = decide_batch(items, await _facts(conn, items), claimed_twice)
        return [await _adopt(conn, slot, d, stamp) for d in decided]


async def _adopt(
    conn: Conn, slot: _Slot, decision: RecordDecision, stamp: tuple[datetime, str]
) -> RecordDecision:
    if decision.outcome is not Outcome.ADOPTABLE:
        return decision
    values = adopted_link_values(slot.active, slot.backfill, decision, *stamp)
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
    return decision.model_copy(update={"outcome": Outcome.ADOPTED})


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


def adopted_link_values(
    active: ActiveMetadata,
    slot: BackfillSlot,
    decision: RecordDecision,
    now: datetime,
    operator: str,
) -> dict[str, Any]:
    """Columns of a `finalized` link adopted from legacy fields (STO-1), frozen from the
    active install exactly as a runtime create would have frozen them."""
    assert decision.link_key and decision.remote_id, "only adoptable decisions"
    validated = validated_values(active)
    install = uuid.UUID(validated.pop("last_validated_pack_install_id"))
    action = active.action_snapshot()
    return {
        "link_key": decision.link_key,
        "connector_owner_key": slot.connector_owner_key,
        "action_slot_id": slot.action_slot_id,
        "action_type": ACTION_TYPE,
        "source_object": slot.source_object,
        "source_record_id": decision.record_id,
        "destination_slot_id": slot.destination_slot_id,
        **validated,
        "created_pack_install_id": install,
        "last_validated_pack_install_id": install,
        "mirror_source_object": slot.source_object,
        "mirror_remote_id_field": action.mirror.remote_id_field,
        "mirror_provenance_field": action.mirror.provenance_field,
        "mapping_fingerprint": action.mapping_fingerprint,
        "body_fingerprint": action.body_fingerprint,
        "remote_id": decision.remote_id,
        "remote_scope": slot.remote_scope,
        "status": LinkStatus.FINALIZED.value,
        # Only a remote id held in the current pair is adoptable: the mirror already shows it.
        "mirror_status": MirrorStatus.WRITTEN.value,
        "last_operator": operator,
        "last_operator_reason": (
            f"MIG-1 backfill: adopted from {decision.provenance_format} provenance"
            f" (slot {decision.via_slot})"
        ),
        "last_operator_at": now,
    }
