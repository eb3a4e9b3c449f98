"""Everything the admission gates read, loaded set-wise for a whole batch of saves
(SPEC WF-2, GATE-1, ID-6): one statement per fact whatever the batch's size.

`load_facts` reads, under link-key locks the caller holds: the active pack per owner
key, the records, the users' permissions, the links and attempts of the saves' keys,
the lineage rows and the association targets. `AdmissionFacts.context` then builds
each save's `AdmissionContext` exactly as a one-save load would, and `reserved` /
`suspended` apply a decision of this batch to the facts, so a later save of the
same batch sees an earlier one's reservation or suspension, as if they had been
admitted one by one in order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from db import link_batches as batch_q
from db import links as q
from db import packs as packs_q
from db.records import Conn
from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import (
    AdmissionContext,
    AssociationTarget,
    AttemptSummary,
    LineageRow,
    PackSlots,
    RecordOwnershipRow,
    RecordView,
    SaveRequest,
)
from protocol.authority import PermissionFacts
from protocol.gates import association_lookups
from protocol.manifest import LineageKind
from protocol.snapshots import LinkSnapshot
from protocol.states import AttemptStatus, LinkStatus
from services.packs import ActivePack, get_active_pack
from services.record_store import LocalRecord, PostgresRecordStore
from services.rows import link_snapshot

SlotKey = tuple[str, str, str]  # owner key, action slot, destination slot
Locus = tuple[str, str, str, str]  # owner key, action slot, source object, record id
RecordId = tuple[str, str, str]  # owner key, source object, record id


@dataclass(frozen=True)
class SaveToAdmit:
    """One save of a batch, with its link key and request keys (GATE-2)."""

    key: str
    save: SaveRequest
    idempotency_key: str = "patch-dispatch"
    locator_value: str | None = None


def _slot_key(save: SaveRequest) -> SlotKey:
    return (save.connector_owner_key, save.action_slot_id, save.destination_slot_id)


def _locus(save: SaveRequest, slot_id: str | None = None) -> Locus:
    slot = slot_id or save.action_slot_id
    return (save.connector_owner_key, slot, save.source_object, save.source_record_id)


def _record_id(save: SaveRequest) -> RecordId:
    return (save.connector_owner_key, save.source_object, save.source_record_id)


def _permission_key(save: SaveRequest) -> tuple[str, str, str] | None:
    user = save.originating_user_id
    return (user, save.source_object, save.source_record_id) if user else None


@dataclass
class AdmissionFacts:
    """The batch's snapshot of storage, kept current with the batch's own decisions."""

    actives: dict[SlotKey, ActiveMetadata | None]
    pack_slots: dict[str, PackSlots]  # per owner key with an active pack (C-6)
    records: dict[tuple[str, str], LocalRecord]
    permissions: dict[tuple[str, str, str], PermissionFacts]
    links: dict[str, LinkSnapshot]  # the saves' own links
    link_states: dict[str, AssociationTarget] = field(default_factory=dict)  # any link read
    attempts: dict[str, list[AttemptSummary]] = field(default_factory=dict)
    loci: dict[Locus, set[str]] = field(default_factory=lambda: defaultdict(set))
    rebound: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    # Every link and attempt of the saves' records, any slot (GATE-1).
    owned: dict[RecordId, list[RecordOwnershipRow]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def active(self, save: SaveRequest) -> ActiveMetadata | None:
        return self.actives[_slot_key(save)]

    def record_view(self, save: SaveRequest) -> RecordView:
        record = self.records.get((save.source_object, save.source_record_id))
        return RecordView(
            exists=record is not None and not record.deleted,
            deleted=record is not None and record.deleted,
            fields=record.fields if record is not None else {},
        )

    def context(self, item: SaveToAdmit, now: datetime) -> AdmissionContext:
        """The one save's plain snapshot, as of every earlier save of the batch."""
        save, active = item.save, self.active(item.save)
        view = self.record_view(save)
        permission_key = _permission_key(save)
        return AdmissionContext(
            save=save,
            active=active,
            link=self.links.get(item.key),
            attempts=tuple(self.attempts.get(item.key, ())),
            lineage_rows=self._lineage(save, active),
            record_rows=tuple(
                r for r in self.owned.get(_record_id(save), ()) if r.link_key != item.key
            ),
            pack_slots=self.pack_slots.get(save.connector_owner_key),
            record=view,
            permissions=self.permissions[permission_key] if permission_key else None,
            association_targets=self._targets(active, view),
            idempotency_key=item.idempotency_key,
            locator_value=item.locator_value,
            decided_at=now,
        )

    def reserved(self, item: SaveToAdmit, attempt: AttemptSummary) -> None:
        """This batch reserved `attempt` for the save's key."""
        self.attempts.setdefault(item.key, []).append(attempt)
        self.loci[_locus(item.save)].add(item.key)
        save = item.save
        self.owned[_record_id(save)].append(
            RecordOwnershipRow(
                link_key=item.key,
                action_slot_id=save.action_slot_id,
                destination_slot_id=save.destination_slot_id,
                attempt_status=attempt.status,
            )
        )

    def suspended(self, key: str, reason: str) -> None:
        """This batch suspended the key's finalized link for drift (DRIFT-2)."""
        link = self.links.get(key)
        if link is None or link.status is not LinkStatus.FINALIZED:
            return  # `suspend_link`'s compare-and-set changes nothing either
        update = {"status": LinkStatus.SUSPENDED_DRIFT, "suspend_reason": reason}
        self.links[key] = link.model_copy(update=update)
        self.link_states[key] = AssociationTarget(
            link_status=LinkStatus.SUSPENDED_DRIFT, remote_id=link.remote_id
        )
        rows = self.owned[
            (link.slot.connector_owner_key, link.slot.source_object, link.source_record_id)
        ]
        rows[:] = [
            r.model_copy(update={"link_status": LinkStatus.SUSPENDED_DRIFT})
            if r.link_key == key and r.link_status is not None
            else r
            for r in rows
        ]

    def _lineage(self, save: SaveRequest, active: ActiveMetadata | None) -> tuple[LineageRow, ...]:
        """Links, then attempts, of this record under each predecessor slot (ID-6)."""
        if active is None or not active.lineage_predecessors:
            return ()
        rebound = self.rebound[(save.connector_owner_key, save.action_slot_id)]
        found = [
            (slot, key)
            for slot in active.lineage_predecessors
            for key in sorted(self.loci.get(_locus(save, slot), ()))
        ]
        links = [
            LineageRow(slot_id=slot, link_status=state.link_status, rebound=slot in rebound)
            for slot, key in found
            if (state := self.link_states.get(key)) is not None
        ]
        attempts = [
            LineageRow(slot_id=slot, attempt_status=a.status, rebound=slot in rebound)
            for slot, key in found
            for a in self.attempts.get(key, ())
        ]
        return (*links, *attempts)

    def _targets(
        self, active: ActiveMetadata | None, view: RecordView
    ) -> dict[str, AssociationTarget]:
        if active is None or not active.usable:
            return {}
        lookups = association_lookups(active, view)
        return {cid: self.link_states.get(key, AssociationTarget()) for cid, key in lookups.items()}


async def load_facts(conn: Conn, items: list[SaveToAdmit]) -> AdmissionFacts:
    """Read everything the batch's gates need, one statement per fact (and per owner key
    for its active install), inside the caller's transaction and link-key locks.

    First it locks the saves' records (G-2): every admission reads through here, so no
    path decides a create while another save of the same record under another slot is
    deciding one; the later reads the earlier's committed reservation."""
    saves = [item.save for item in items]
    record_ids = sorted({_record_id(s) for s in saves})
    await batch_q.lock_records(conn, record_ids)
    keys = sorted({item.key for item in items})
    store = PostgresRecordStore(conn)
    packs = {
        owner: await get_active_pack(conn, owner)
        for owner in sorted({s.connector_owner_key for s in saves})
    }
    facts = AdmissionFacts(
        actives=_actives(packs, saves),
        pack_slots={o: PackSlots.of(p.manifest) for o, p in packs.items() if p is not None},
        records=await store.read_records(
            sorted({(s.source_object, s.source_record_id) for s in saves})
        ),
        permissions=await store.read_permissions_many(
            sorted({k for s in saves if (k := _permission_key(s)) is not None})
        ),
        links={
            k: link_snapshot(row) for k, row in (await batch_q.links_by_keys(conn, keys)).items()
        },
    )
    for key, link in facts.links.items():
        facts.link_states[key] = AssociationTarget(
            link_status=link.status, remote_id=link.remote_id
        )
    for row in await batch_q.attempt_statuses_by_keys(conn, keys):
        facts.attempts.setdefault(row["link_key"], []).append(_summary(row))
    for item in items:
        if item.key in facts.links or item.key in facts.attempts:
            facts.loci[_locus(item.save)].add(item.key)
    rows = await batch_q.record_rows_many(conn, record_ids)
    for row in rows:
        facts.owned[_record_id_of(row)].append(_ownership(row))
    await _load_lineage(conn, facts, saves, set(keys), rows)
    await _load_targets(conn, facts, saves)
    return facts


def _record_id_of(row: q.Row) -> RecordId:
    return (row["connector_owner_key"], row["source_object"], row["source_record_id"])


def _ownership(row: q.Row) -> RecordOwnershipRow:
    is_link = row["kind"] == "link"
    return RecordOwnershipRow(
        link_key=row["link_key"],
        action_slot_id=row["action_slot_id"],
        destination_slot_id=row["destination_slot_id"],
        link_status=LinkStatus(row["status"]) if is_link else None,
        attempt_status=None if is_link else AttemptStatus(row["status"]),
        remote_id=row["remote_id"],
    )


def _summary(row: q.Row) -> AttemptSummary:
    return AttemptSummary(
        attempt_id=str(row["attempt_id"]),
        status=AttemptStatus(row["status"]),
        dispatch_lane=row["dispatch_lane"],
        attempt_ordinal=row["attempt_ordinal"],
    )


def _actives(
    packs: dict[str, ActivePack | None], saves: list[SaveRequest]
) -> dict[SlotKey, ActiveMetadata | None]:
    """Each owner's active install (read once) resolved once per (action, destination) slot."""
    actives: dict[SlotKey, ActiveMetadata | None] = {}
    for owner, action_slot, destination_slot in sorted({_slot_key(s) for s in saves}):
        pack = packs[owner]
        actives[(owner, action_slot, destination_slot)] = (
            None
            if pack is None
            else resolve_active(
                pack.manifest,
                pack.pack_install_id,
                action_slot,
                destination_slot,
                install_ancestors=frozenset(pack.ancestors),
                create_blocked=pack.create_blocked,
            )
        )
    return actives


async def _load_lineage(
    conn: Conn,
    facts: AdmissionFacts,
    saves: list[SaveRequest],
    own_keys: set[str],
    record_rows: list[q.Row],
) -> None:
    """Rows for the saves' records under every predecessor slot (ID-6), taken from the
    records' rows already read, and which of those slots the active install rebinds."""
    wanted: set[Locus] = set()
    for save in saves:
        active = facts.active(save)
        if active is None or not active.lineage_predecessors:
            continue
        wanted.update(_locus(save, slot) for slot in active.lineage_predecessors)
        pair = (save.connector_owner_key, save.action_slot_id)
        if pair not in facts.rebound:
            rows = await packs_q.select_active_predecessors(conn, *pair)
            facts.rebound[pair] = frozenset(
                r.from_slot for r in rows if r.kind is LineageKind.REBIND
            )
    if not wanted:
        return
    for row in record_rows:
        key = row["link_key"]
        locus = (
            row["connector_owner_key"],
            row["action_slot_id"],
            row["source_object"],
            row["source_record_id"],
        )
        if locus not in wanted:
            continue
        facts.loci[locus].add(key)
        if key in own_keys:
            continue  # a save's own key: its link and attempts are loaded in full already
        if row["kind"] == "link":
            facts.link_states[key] = AssociationTarget(
                link_status=LinkStatus(row["status"]), remote_id=row["remote_id"]
            )
        else:
            facts.attempts.setdefault(key, []).append(_summary(row))


async def _load_targets(conn: Conn, facts: AdmissionFacts, saves: list[SaveRequest]) -> None:
    """The association target links every save's record names (LANE-2), in one read."""
    wanted: set[str] = set()
    for save in saves:
        active = facts.active(save)
        if active is not None and active.usable:
            wanted.update(association_lookups(active, facts.record_view(save)).values())
    wanted -= set(facts.link_states)
    if not wanted:
        return
    for key, row in (await q.link_targets(conn, sorted(wanted))).items():
        facts.link_states[key] = AssociationTarget(
            link_status=LinkStatus(row["status"]), remote_id=row["remote_id"]
        )
