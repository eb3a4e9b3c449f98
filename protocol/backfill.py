"""Legacy-link adoption (SPEC MIG-1, seed "Migration Contract For #1783"): pure decisions.

Rules kept in this module:

1. Evidence is only what a local record materialised in a mirror pair
   (`remoteIdField`, `provenanceField`) of the action slot: the active
   install's pair, or a pair an earlier install of the same pack declared for
   this slot or a slot rebound into it. Nothing is inferred from names.
2. Exactly two provenance formats are accepted (`parse_provenance`): the
   runtime's own link key (`lk1_<64 hex>`, what activities/mirror.py writes)
   and the legacy marker `"{ConnectorOwnerKey}:{ActionSlotId}:{DestinationSlotId}"`
   (exactly three valid stable ids; an id holding `:` makes a marker ambiguous,
   so it is not recognised). Anything else is `provenance_unrecognized`.
3. A record is adoptable only when one remote id and one provenance, both in
   the current pair, name this owner, this slot (or a slot the active pack
   rebinds into it) and this destination, and nothing stored or claimed in the
   batch contradicts it. Every other case with evidence is `rejected` with one
   `RejectReason`; the first failing check in `decide_record` wins.
4. A record with no evidence at all is `skipped`; a link already holding the
   record's remote id is `already_adopted` (re-running apply adopts nothing new).
5. Nothing here reads storage, clocks or ids: the caller loads `StoredFacts`
   for the keys and locators `lookups` names, and acts on the decisions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Final

from pydantic import JsonValue

from protocol.active import ActiveMetadata
from protocol.identity import InvalidIdentityPart, check_part, link_key
from protocol.manifest import MirrorSpec, PackManifest
from protocol.remote_ids import RemoteIdError, check_remote_id
from protocol.snapshots import Snapshot
from protocol.states import AttemptStatus, LinkStatus

LINK_KEY_PROVENANCE: Final = re.compile(r"lk1_[0-9a-f]{64}")
MARKER_SEPARATOR: Final = ":"


class Outcome(StrEnum):
    ADOPTABLE = "adoptable"  # plan: apply would create the link
    ADOPTED = "adopted"  # apply: the link was created by this run
    ALREADY_ADOPTED = "already_adopted"  # a link with this remote id exists
    SKIPPED = "skipped"  # no legacy evidence: not a candidate
    REJECTED = "rejected"  # evidence, but ambiguous: fails closed, nothing written


class RejectReason(StrEnum):
    NO_REMOTE_ID_AND_NO_PROVENANCE = "no_remote_id_and_no_provenance"  # the skip reason
    INVALID_RECORD_ID = "invalid_record_id"
    SOURCE_DELETED = "source_deleted"
    MALFORMED_MIRROR_VALUE = "malformed_mirror_value"
    MULTIPLE_CANDIDATE_REMOTE_IDS = "multiple_candidate_remote_ids"
    MULTIPLE_CANDIDATE_PROVENANCES = "multiple_candidate_provenances"
    REMOTE_ID_OUTSIDE_CURRENT_FIELD_PAIR = "remote_id_outside_current_field_pair"
    REMOTE_ID_WITHOUT_PROVENANCE = "remote_id_without_provenance"
    PROVENANCE_WITHOUT_REMOTE_ID = "provenance_without_remote_id"
    PROVENANCE_UNRECOGNIZED = "provenance_unrecognized"
    PROVENANCE_KEY_MISMATCH = "provenance_key_mismatch"
    PROVENANCE_FOR_OTHER_OWNER = "provenance_for_other_owner"
    PROVENANCE_FOR_OTHER_SLOT = "provenance_for_other_slot"
    DESTINATION_CHANGED = "destination_changed"
    LINK_EXISTS_WITH_OTHER_REMOTE_ID = "link_exists_with_other_remote_id"
    ATTEMPT_EXISTS = "attempt_exists"
    REMOTE_ID_CLAIMED_TWICE = "remote_id_claimed_twice"


class ProvenanceFormat(StrEnum):
    LINK_KEY = "link_key"
    LEGACY_MARKER = "legacy_marker"


R = RejectReason


# -- inputs ------------------------------------------------------------------------


class BackfillSlot(Snapshot):
    """One action slot of the active install, with everything adoption compares against."""

    connector_owner_key: str
    action_slot_id: str
    destination_slot_id: str
    source_object: str
    remote_scope: str
    current_pair: MirrorSpec
    # Pairs earlier installs declared for this slot or a predecessor, other than the current.
    earlier_pairs: tuple[MirrorSpec, ...] = ()
    # Slots the active pack rebinds (transitively) into this one (ID-6).
    rebound_from: tuple[str, ...] = ()
    # Every action / destination slot id the pack ever named: the link keys a
    # link-key provenance is matched against.
    known_action_slots: tuple[str, ...] = ()
    known_destination_slots: tuple[str, ...] = ()

    def key_for(self, record_id: str, action_slot_id: str | None = None) -> str:
        """This record's link key under this slot (or under `action_slot_id`, same destination)."""
        return link_key(
            self.connector_owner_key,
            action_slot_id or self.action_slot_id,
            self.source_object,
            record_id,
            self.destination_slot_id,
        )


class LegacyRecord(Snapshot):
    """One local record as the store holds it (deleted ones included)."""

    source_object: str
    record_id: str
    fields: dict[str, JsonValue]
    deleted: bool = False


class Locator(Snapshot):
    """The ID-4 remote-locator tuple."""

    connector_owner_key: str
    destination_slot_id: str
    remote_scope: str
    remote_id: str


class LinkFact(Snapshot):
    link_key: str
    action_slot_id: str
    locator: Locator
    status: LinkStatus


class AttemptFact(Snapshot):
    link_key: str
    attempt_id: str
    status: AttemptStatus


class StoredFacts(Snapshot):
    """Rows for the keys and locators `lookups` named (read under the key locks on apply)."""

    links: tuple[LinkFact, ...] = ()
    attempts: tuple[AttemptFact, ...] = ()
    # Non-retired links owning a locator the batch claims, whatever their key.
    locator_owners: tuple[LinkFact, ...] = ()


class Lookups(Snapshot):
    link_keys: tuple[str, ...]  # sorted: the order apply locks them in
    locators: tuple[Locator, ...]


# -- outputs ------------------------------------------------------------------------


class RecordDecision(Snapshot):
    action_slot_id: str
    source_object: str
    record_id: str
    outcome: Outcome
    reason: RejectReason | None = None
    detail: str = ""
    link_key: str | None = None
    remote_id: str | None = None
    provenance_format: ProvenanceFormat | None = None
    # The slot the provenance named: this one, or a predecessor it rebinds.
    via_slot: str | None = None


class Provenance(Snapshot):
    format: ProvenanceFormat
    value: str
    connector_owner_key: str | None = None
    action_slot_id: str | None = None
    destination_slot_id: str | None = None


class _Evidence(Snapshot):
    """The values one record holds in a slot's mirror pairs (malformed ones named)."""

    remote_id: str | None
    provenance: str | None
    earlier_remote_ids: tuple[tuple[str, str], ...]  # (field, value)
    earlier_provenances: tuple[tuple[str, str], ...]
    malformed: tuple[str, ...]

    @property
    def remote_ids(self) -> set[str]:
        return _values(self.remote_id, self.earlier_remote_ids)

    @property
    def provenances(self) -> set[str]:
        return _values(self.provenance, self.earlier_provenances)

    @property
    def empty(self) -> bool:
        return not (self.remote_ids or self.provenances or self.malformed)


def _values(current: str | None, earlier: tuple[tuple[str, str], ...]) -> set[str]:
    found = {value for _, value in earlier}
    return found | {current} if current is not None else found


# -- building the slot ------------------------------------------------------------------


def backfill_slot(
    manifest: PackManifest, active: ActiveMetadata, earlier: Sequence[PackManifest] = ()
) -> BackfillSlot:
    """The slot as adoption sees it; `earlier` are the manifests of the active install's
    ancestors (not across a reinstall), newest first. `active` must be usable."""
    action, destination, _ = active.require()
    lineage_slots = {e.from_slot for m in (manifest, *earlier) for e in m.lineage}
    named = {active.action_slot_id, *active.lineage_predecessors}
    pairs: list[MirrorSpec] = []
    for old in earlier:
        for slot in old.action_slots:
            if slot.id in named and slot.mirror != action.mirror and slot.mirror not in pairs:
                pairs.append(slot.mirror)
    everything = (manifest, *earlier)
    return BackfillSlot(
        connector_owner_key=active.connector_owner_key,
        action_slot_id=active.action_slot_id,
        destination_slot_id=active.destination_slot_id,
        source_object=action.source_object,
        remote_scope=destination.remote_scope,
        current_pair=action.mirror,
        earlier_pairs=tuple(pairs),
        rebound_from=active.lineage_predecessors,
        known_action_slots=tuple(
            sorted({s.id for m in everything for s in m.action_slots} | lineage_slots)
        ),
        known_destination_slots=tuple(
            sorted({d.id for m in everything for d in m.destination_slots})
        ),
    )


# -- provenance ---------------------------------------------------------------------------


def parse_provenance(value: str) -> Provenance | None:
    """One of the two accepted formats (rule 2), or None."""
    if LINK_KEY_PROVENANCE.fullmatch(value):
        return Provenance(format=ProvenanceFormat.LINK_KEY, value=value)
    parts = value.split(MARKER_SEPARATOR)
    if len(parts) != 3:
        return None
    try:
        owner, slot, destination = (check_part("marker", p) for p in parts)
    except InvalidIdentityPart:
        return None
    return Provenance(
        format=ProvenanceFormat.LEGACY_MARKER,
        value=value,
        connector_owner_key=owner,
        action_slot_id=slot,
        destination_slot_id=destination,
    )


def _named_by_key(slot: BackfillSlot, record_id: str, key: str) -> tuple[str, str] | None:
    """(action slot, destination slot) whose link key for this record is `key`."""
    if key == slot.key_for(record_id):
        return slot.action_slot_id, slot.destination_slot_id
    for action_slot in slot.known_action_slots:
        for destination in slot.known_destination_slots:
            candidate = link_key(
                slot.connector_owner_key, action_slot, slot.source_object, record_id, destination
            )
            if candidate == key:
                return action_slot, destination
    return None


def _resolve_provenance(
    slot: BackfillSlot, record_id: str, provenance: Provenance
) -> tuple[str, RecordDecision | None]:
    """The slot the provenance names (this one or a rebound predecessor), or a rejection."""
    owner, action_slot, destination = (
        provenance.connector_owner_key,
        provenance.action_slot_id,
        provenance.destination_slot_id,
    )
    if provenance.format is ProvenanceFormat.LINK_KEY:
        named = _named_by_key(slot, record_id, provenance.value)
        if named is None:
            detail = "a link key of no slot and destination of this pack for this record"
            return "", _reject(slot, record_id, R.PROVENANCE_KEY_MISMATCH, detail)
        owner, (action_slot, destination) = slot.connector_owner_key, named
    if owner != slot.connector_owner_key:
        return "", _reject(slot, record_id, R.PROVENANCE_FOR_OTHER_OWNER, f"owner {owner!r}")
    assert action_slot is not None and destination is not None
    if action_slot != slot.action_slot_id and action_slot not in slot.rebound_from:
        detail = f"slot {action_slot!r} is not rebound into {slot.action_slot_id!r}"
        return "", _reject(slot, record_id, R.PROVENANCE_FOR_OTHER_SLOT, detail)
    if destination != slot.destination_slot_id:
        detail = f"{destination!r} != {slot.destination_slot_id!r}"
        return "", _reject(slot, record_id, R.DESTINATION_CHANGED, detail)
    return action_slot, None


# -- evidence -----------------------------------------------------------------------------


def _text(fields: dict[str, JsonValue], name: str, malformed: list[str]) -> str | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            # PROF-4: a remote id (and a provenance) is adopted only in canonical form.
            return check_remote_id(check_part(name, value))
        except (InvalidIdentityPart, RemoteIdError):
            pass
    malformed.append(name)
    return None


def evidence(slot: BackfillSlot, record: LegacyRecord) -> _Evidence:
    malformed: list[str] = []
    pair = slot.current_pair
    current = (
        _text(record.fields, pair.remote_id_field, malformed),
        _text(record.fields, pair.provenance_field, malformed),
    )
    earlier_ids: list[tuple[str, str]] = []
    earlier_provs: list[tuple[str, str]] = []
    for old in slot.earlier_pairs:
        for field, found in (
            (old.remote_id_field, earlier_ids),
            (old.provenance_field, earlier_provs),
        ):
            value = _text(record.fields, field, malformed)
            if value is not None and (field, value) not in found:
                found.append((field, value))
    return _Evidence(
        remote_id=current[0],
        provenance=current[1],
        earlier_remote_ids=tuple(earlier_ids),
        earlier_provenances=tuple(earlier_provs),
        malformed=tuple(sorted(set(malformed))),
    )


def _evidence_problem(ev: _Evidence, pair: MirrorSpec) -> tuple[RejectReason, str] | None:
    """Rule 3 on the record's fields alone: one remote id and one provenance, current pair."""
    if ev.malformed:
        return R.MALFORMED_MIRROR_VALUE, f"not a clean string: {list(ev.malformed)}"
    if len(ev.remote_ids) > 1:
        return R.MULTIPLE_CANDIDATE_REMOTE_IDS, f"{sorted(ev.remote_ids)}"
    outside = [f for f, _ in ev.earlier_remote_ids if ev.remote_id is None]
    outside += [f for f, _ in ev.earlier_provenances if ev.provenance is None]
    if outside:
        detail = f"evidence in {outside}, not in {[pair.remote_id_field, pair.provenance_field]}"
        return R.REMOTE_ID_OUTSIDE_CURRENT_FIELD_PAIR, detail
    if len(ev.provenances) > 1:
        return R.MULTIPLE_CANDIDATE_PROVENANCES, f"{sorted(ev.provenances)}"
    if ev.provenance is None:
        return R.REMOTE_ID_WITHOUT_PROVENANCE, f"{pair.provenance_field} is empty"
    if ev.remote_id is None:
        return R.PROVENANCE_WITHOUT_REMOTE_ID, f"{pair.remote_id_field} is empty"
    return None


def claims(slot: BackfillSlot, record: LegacyRecord) -> frozenset[Locator]:
    """Every locator the record's fields name for this slot, ambiguous or not."""
    return frozenset(_locator(slot, rid) for rid in evidence(slot, record).remote_ids)


def _locator(slot: BackfillSlot, remote_id: str) -> Locator:
    return Locator(
        connector_owner_key=slot.connector_owner_key,
        destination_slot_id=slot.destination_slot_id,
        remote_scope=slot.remote_scope,
        remote_id=remote_id,
    )


def contested(items: Iterable[tuple[BackfillSlot, LegacyRecord]]) -> frozenset[Locator]:
    """Locators claimed by more than one (slot, record): none of their claimants is adopted."""
    counts: Counter[Locator] = Counter()
    for slot, record in items:
        counts.update(claims(slot, record))
    return frozenset(locator for locator, n in counts.items() if n > 1)


# -- the decision ---------------------------------------------------------------------------


def _decision(
    slot: BackfillSlot, record_id: str, outcome: Outcome, **extra: object
) -> RecordDecision:
    return RecordDecision.model_validate(
        {
            "action_slot_id": slot.action_slot_id,
            "source_object": slot.source_object,
            "record_id": record_id,
            "outcome": outcome,
            **extra,
        }
    )


def _reject(
    slot: BackfillSlot, record_id: str, reason: RejectReason, detail: str = "", **extra: object
) -> RecordDecision:
    return _decision(slot, record_id, Outcome.REJECTED, reason=reason, detail=detail, **extra)


def lookups(items: Iterable[tuple[BackfillSlot, LegacyRecord]]) -> Lookups:
    """The link keys (this slot's and its rebound predecessors') and locators to load."""
    keys: set[str] = set()
    locators: set[Locator] = set()
    for slot, record in items:
        try:
            keys.add(slot.key_for(record.record_id))
            keys.update(slot.key_for(record.record_id, p) for p in slot.rebound_from)
        except InvalidIdentityPart:
            continue
        locators |= claims(slot, record)
    return Lookups(
        link_keys=tuple(sorted(keys)),
        locators=tuple(sorted(locators, key=lambda x: tuple(x.model_dump().values()))),
    )


def decide_record(
    slot: BackfillSlot,
    record: LegacyRecord,
    facts: StoredFacts,
    contested_locators: frozenset[Locator] = frozenset(),
) -> RecordDecision:
    """Rules 3 and 4 for one record; the first failing check wins."""
    rid = record.record_id
    ev = evidence(slot, record)
    if ev.empty:
        return _decision(slot, rid, Outcome.SKIPPED, reason=R.NO_REMOTE_ID_AND_NO_PROVENANCE)
    try:
        key = slot.key_for(rid)
    except InvalidIdentityPart as error:
        return _reject(slot, rid, R.INVALID_RECORD_ID, str(error))
    existing = next((link for link in facts.links if link.link_key == key), None)
    if existing is not None:
        return _existing_link(slot, rid, ev, existing)
    if record.deleted:
        return _reject(slot, rid, R.SOURCE_DELETED, link_key=key)
    problem = _evidence_problem(ev, slot.current_pair)
    if problem is not None:
        return _reject(slot, rid, problem[0], problem[1], link_key=key)
    assert ev.remote_id is not None and ev.provenance is not None
    provenance = parse_provenance(ev.provenance)
    if provenance is None:
        detail = f"{slot.current_pair.provenance_field}={ev.provenance!r}"
        return _reject(slot, rid, R.PROVENANCE_UNRECOGNIZED, detail, link_key=key)
    via, rejected = _resolve_provenance(slot, rid, provenance)
    if rejected is not None:
        return rejected.model_copy(update={"link_key": key})
    found = {"link_key": key, "remote_id": ev.remote_id, "provenance_format": provenance.format}
    conflict = _stored_conflict(slot, rid, key, _locator(slot, ev.remote_id), facts)
    if conflict is None and _locator(slot, ev.remote_id) in contested_locators:
        conflict = (R.REMOTE_ID_CLAIMED_TWICE, "another local record claims the same remote id")
    if conflict is not None:
        return _reject(slot, rid, conflict[0], conflict[1], **found, via_slot=via)
    return _decision(slot, rid, Outcome.ADOPTABLE, **found, via_slot=via)


def _existing_link(
    slot: BackfillSlot, record_id: str, ev: _Evidence, link: LinkFact
) -> RecordDecision:
    """The link is the SSoT: the record either agrees with it or is reported."""
    remote_id = link.locator.remote_id
    if ev.remote_ids == {remote_id}:
        return _decision(
            slot,
            record_id,
            Outcome.ALREADY_ADOPTED,
            link_key=link.link_key,
            remote_id=remote_id,
            detail=f"link is {link.status.value}",
        )
    detail = f"link holds {remote_id!r}, record holds {sorted(ev.remote_ids)}"
    return _reject(
        slot, record_id, R.LINK_EXISTS_WITH_OTHER_REMOTE_ID, detail, link_key=link.link_key
    )


def _stored_conflict(
    slot: BackfillSlot, record_id: str, key: str, locator: Locator, facts: StoredFacts
) -> tuple[RejectReason, str] | None:
    keys = {key, *(slot.key_for(record_id, p) for p in slot.rebound_from)}
    for link in facts.links:
        if (
            link.link_key in keys
            and link.status is not LinkStatus.RETIRED
            and link.locator.remote_id != locator.remote_id
        ):
            detail = f"slot {link.action_slot_id!r} links {link.locator.remote_id!r}"
            return R.LINK_EXISTS_WITH_OTHER_REMOTE_ID, detail
    owner = next(
        (
            link
            for link in facts.locator_owners
            if link.locator == locator
            and link.link_key != key
            and link.status is not LinkStatus.RETIRED
        ),
        None,
    )
    if owner is not None:
        return R.REMOTE_ID_CLAIMED_TWICE, f"already linked by {owner.link_key}"
    # A finalized attempt's outcome is its link, weighed above (a retired predecessor link
    # is how an operator hands a renamed slot's remote object over, GATE-1); any other
    # attempt may still act, or may have acted, and blocks adoption.
    attempt = next(
        (
            a
            for a in facts.attempts
            if a.link_key in keys and a.status is not AttemptStatus.FINALIZED
        ),
        None,
    )
    if attempt is not None:
        return R.ATTEMPT_EXISTS, f"attempt {attempt.attempt_id} is {attempt.status.value}"
    return None


def decide_batch(
    items: Sequence[tuple[BackfillSlot, LegacyRecord]],
    facts: StoredFacts,
    contested_locators: frozenset[Locator] = frozenset(),
) -> tuple[RecordDecision, ...]:
    """Every record of one batch; locators claimed twice inside it are contested too."""
    everywhere = contested_locators | contested(items)
    return tuple(decide_record(slot, record, facts, everywhere) for slot, record in items)


class Totals(Snapshot):
    adoptable: int = 0
    adopted: int = 0
    already_adopted: int = 0
    skipped: int = 0
    rejected: int = 0


def totals(decisions: Iterable[RecordDecision]) -> Totals:
    counts = Counter(d.outcome.value for d in decisions)
    return Totals.model_validate(dict(counts))
