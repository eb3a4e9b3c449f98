"""The prior-ownership gate (SPEC GATE-1, ID-6; seed "Stable Slot Identity" and the drift
row "Flow action removed/recreated with new or missing ActionSlotId").

A create is reserved only when nothing suggests the record already owns a remote
object at this destination. Two kinds of evidence count, both for the same owner
and the same source record:

1. a link that is not retired, or an attempt that is not released,
   - under another action slot at this remote destination (G-2: the same remote scope
     and target object, whichever destination slot names it), unless that slot is a
     declared lineage predecessor of this one (those rows are ID-6's: `LineageRow`) or
     the pack declares the two action slots deliberately separate (`separateOwnership`);
   - or under this action slot at another destination slot. An action slot names one
     destination, so such a row is from before its destination was recreated with a
     new `DestinationSlotId` (seed drift rows "connector profile … recreated with new
     DestinationSlotId" and "target object changes with new/missing
     DestinationSlotId": fail closed, no name-derived replacement attempt, migration
     or rebind only). The new key finds no rows, but the record may already own the
     remote object the old row created; retiring the old link resolves it;
   - or under an action or destination slot the active pack no longer has (SPEC C-6):
     a slot removed, or recreated under a new id without a declared rebind. Renaming
     both slots (and the mirror pair) leaves no other trace of the remote object the
     old row may own: retiring or superseding the old rows, or declaring the rebind,
     resolves it;
2. a value in this slot's mirror field pair: a remote id, or a provenance naming
   another link key or a legacy marker for this owner and destination, unless a
   retired link of this record explains it (an operator resolved that ownership).
   A link under a lineage predecessor does not, live or retired: a rebind declared in
   the pack finds the old rows (ID-6), it does not move the remote object to the new
   slot; `backfill` does that once the old link is retired. Until it has, a create
   here would be a second remote object for the record, the one the rebind was
   declared to keep (docs/packs.md: "declare the lineage, retire the old link,
   backfill": a save between the retire and the backfill must not POST). To create
   anew instead, drop the rebind from the pack (or clear the mirror pair).

Anything else is `rejected(prior_ownership_uncertain)` naming what was found. A
recomputed key that found no rows never proves absence on its own.
"""

from __future__ import annotations

from pydantic import JsonValue

from protocol.admission import AdmissionContext, RecordOwnershipRow, Rejected
from protocol.backfill_evidence import LINK_KEY_PROVENANCE, parse_provenance
from protocol.backfill_facts import ProvenanceFormat
from protocol.errors import RejectReason
from protocol.states import ATTEMPT_RELEASED, LinkStatus


def prior_ownership(ctx: AdmissionContext, key: str) -> Rejected | None:
    """The refusal naming every piece of unexplained prior-ownership evidence, or None."""
    assert ctx.active is not None and ctx.active.action is not None
    lineage = frozenset(ctx.active.lineage_predecessors)
    found = [
        *_other_slot_rows(ctx, lineage),
        *_live_rebound_rows(ctx),
        *_mirror_evidence(ctx, key),
    ]
    if not found:
        return None
    return Rejected(
        reason=RejectReason.PRIOR_OWNERSHIP_UNCERTAIN, detail="; ".join(found), link_key=key
    )


def _live(row: RecordOwnershipRow) -> bool:
    link_live = row.link_status not in (None, LinkStatus.RETIRED)
    attempt_live = row.attempt_status not in (None, *ATTEMPT_RELEASED)
    return link_live or attempt_live


def _other_slot_rows(ctx: AdmissionContext, lineage: frozenset[str]) -> list[str]:
    """Live rows under another slot pair at this remote destination, under this action
    slot elsewhere, or under a slot the active pack no longer has (C-6)."""
    return [
        _describe(row)
        for row in ctx.record_rows
        if _live(row)
        and (
            _same_remote_destination(ctx, row, lineage)
            or (
                row.action_slot_id == ctx.save.action_slot_id
                and row.destination_slot_id != ctx.save.destination_slot_id
            )
            or _orphaned(ctx, row, lineage)
        )
    ]


def _same_remote_destination(
    ctx: AdmissionContext, row: RecordOwnershipRow, lineage: frozenset[str]
) -> bool:
    """G-2: a row under another action slot that creates at the same remote destination
    (remote scope and target object), whichever destination slot names it, unless it is
    a lineage predecessor (ID-6, weighed by its own rule) or the pack declares the two
    action slots deliberately separate owners."""
    save = ctx.save
    if row.action_slot_id == save.action_slot_id or row.action_slot_id in lineage:
        return False
    if ctx.pack_slots is None:  # no pack read: the slot ids are all there is to compare
        return row.destination_slot_id == save.destination_slot_id
    if ctx.pack_slots.declared_separate(save.action_slot_id, row.action_slot_id):
        return False
    if row.destination_slot_id == save.destination_slot_id:
        return True
    here = ctx.pack_slots.remote_destination(save.destination_slot_id)
    return here is not None and here == ctx.pack_slots.remote_destination(row.destination_slot_id)


def _orphaned(ctx: AdmissionContext, row: RecordOwnershipRow, lineage: frozenset[str]) -> bool:
    """C-6: a row under an action or destination slot the active pack no longer has
    (removed, or recreated under a new id without a declared rebind). Its remote object
    may be the one this create would make again (the record's mirror pair may be new or
    never written), so nothing proves the record owns no remote object here."""
    return (
        ctx.pack_slots is not None
        and row.action_slot_id not in lineage
        and not ctx.pack_slots.knows(row)
    )


def _live_rebound_rows(ctx: AdmissionContext) -> list[str]:
    """A rebound predecessor whose link or attempt is still live: the rebind names the
    old rows (ID-6) but does not move their remote object here, so a create would be a
    second object even when the old link's mirror was never written (no mirror evidence).
    The way out is to retire the old link, then `backfill` adopts its object."""
    found: list[str] = []
    for row in ctx.lineage_rows:
        if not row.rebound:
            continue  # unresolved lineage is refused before this gate (lineage_unresolved)
        link, attempt = row.link_status, row.attempt_status
        if link is not None and link is not LinkStatus.RETIRED:
            found.append(f"link under rebound slot {row.slot_id!r} is {link.value}")
        elif attempt is not None and attempt not in ATTEMPT_RELEASED:
            found.append(f"attempt under rebound slot {row.slot_id!r} is {attempt.value}")
    return found


def _describe(row: RecordOwnershipRow) -> str:
    if row.link_status is not None:
        what = f"link {row.link_key} ({row.link_status.value}, remote id {row.remote_id})"
    else:
        assert row.attempt_status is not None
        what = f"attempt of {row.link_key} ({row.attempt_status.value})"
    return f"{what} under slot {row.action_slot_id!r} at {row.destination_slot_id!r}"


def _mirror_evidence(ctx: AdmissionContext, key: str) -> list[str]:
    """Values in this slot's mirror pair that no retired link of the record explains."""
    assert ctx.active is not None and ctx.active.action is not None
    mirror = ctx.active.action.mirror
    lineage = frozenset(ctx.active.lineage_predecessors)
    explaining = [
        row
        for row in ctx.record_rows
        if row.link_status is LinkStatus.RETIRED and row.action_slot_id not in lineage
    ]
    found: list[str] = []
    remote_id = _text(ctx.record.fields.get(mirror.remote_id_field))
    if remote_id is not None and not any(r.remote_id == remote_id for r in explaining):
        found.append(f"{mirror.remote_id_field}={remote_id!r} in the record's mirror")
    provenance = _text(ctx.record.fields.get(mirror.provenance_field))
    if (
        provenance is not None
        and provenance != key
        and _names_this_destination(ctx, provenance)
        and not any(_explains(r, ctx, provenance) for r in explaining)
    ):
        found.append(f"{mirror.provenance_field}={provenance!r} in the record's mirror")
    return found


def _names_this_destination(ctx: AdmissionContext, provenance: str) -> bool:
    """A link key (of any slot), or a legacy marker for this owner and destination."""
    if LINK_KEY_PROVENANCE.fullmatch(provenance):
        return True
    parsed = parse_provenance(provenance)
    return (
        parsed is not None
        and parsed.format is ProvenanceFormat.LEGACY_MARKER
        and parsed.connector_owner_key == ctx.save.connector_owner_key
        and parsed.destination_slot_id == ctx.save.destination_slot_id
    )


def _explains(row: RecordOwnershipRow, ctx: AdmissionContext, provenance: str) -> bool:
    owner = ctx.save.connector_owner_key
    marker = f"{owner}:{row.action_slot_id}:{row.destination_slot_id}"
    return provenance in (row.link_key, marker)


def _text(value: JsonValue) -> str | None:
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else repr(value)
