"""Legacy-link adoption (SPEC MIG-1, seed "Migration Contract For #1783"): pure decisions.

Rules kept in this module (1-2, what counts as evidence and which provenance
formats are accepted, live in `protocol.backfill_evidence`):

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

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from protocol.backfill_evidence import (
    Evidence,
    Provenance,
    claimed_twice,
    claims_in,
    evidence,
    evidence_problem,
    locator_of,
    parse_provenance,
)
from protocol.backfill_facts import (
    BackfillSlot,
    LegacyRecord,
    LinkFact,
    Locator,
    Lookups,
    Outcome,
    ProvenanceFormat,
    RecordDecision,
    RejectReason,
    StoredFacts,
)
from protocol.identity import InvalidIdentityPart, link_key
from protocol.snapshots import Snapshot
from protocol.states import AttemptStatus, LinkStatus

R = RejectReason


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


@dataclass(frozen=True)
class Prepared:
    """One (slot, record) with what every rule reads of it, computed once per page."""

    slot: BackfillSlot
    record: LegacyRecord
    evidence: Evidence
    key: str | None  # None: the record id is not a valid identity part
    key_error: str
    keys: frozenset[str]  # `key` and its keys under the rebound predecessors

    @property
    def claims(self) -> frozenset[Locator]:
        return claims_in(self.slot, self.evidence)


Keys = tuple[str | None, str, frozenset[str]]


def prepare(
    items: Iterable[tuple[BackfillSlot, LegacyRecord]], known: Mapping[str, Keys] | None = None
) -> list[Prepared]:
    """`known`: `record_keys` already computed, by record id (one slot's records only)."""
    prepared: list[Prepared] = []
    for slot, record in items:
        found = known.get(record.record_id) if known is not None else None
        key, error, keys = found or record_keys(slot, record.record_id)
        prepared.append(Prepared(slot, record, evidence(slot, record), key, error, keys))
    return prepared


def record_keys(slot: BackfillSlot, record_id: str) -> Keys:
    """The record's link key under the slot (None and why, if the id is not a valid
    identity part), and every key apply locks for it: that one and the rebound ones'."""
    try:
        key = slot.key_for(record_id)
        rebound = {slot.key_for(record_id, p) for p in slot.rebound_from}
    except InvalidIdentityPart as exc:
        return None, str(exc), frozenset()
    return key, "", frozenset({key, *rebound})


def lookups(items: Iterable[tuple[BackfillSlot, LegacyRecord]] | Sequence[Prepared]) -> Lookups:
    """The link keys (this slot's and its rebound predecessors') and locators to load."""
    prepared = [i if isinstance(i, Prepared) else prepare([i])[0] for i in items]
    keys: set[str] = set()
    locators: set[Locator] = set()
    for p in prepared:
        if p.key is None:
            continue
        keys |= p.keys
        locators |= p.claims
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
    return _decide(prepare([(slot, record)])[0], facts, contested_locators)


def _decide(
    p: Prepared, facts: StoredFacts, contested_locators: frozenset[Locator]
) -> RecordDecision:
    slot, record, ev = p.slot, p.record, p.evidence
    rid = record.record_id
    if ev.empty:
        return _decision(slot, rid, Outcome.SKIPPED, reason=R.NO_REMOTE_ID_AND_NO_PROVENANCE)
    if p.key is None:
        return _reject(slot, rid, R.INVALID_RECORD_ID, p.key_error)
    key = p.key
    existing = next((link for link in facts.links if link.link_key == key), None)
    if existing is not None:
        return _existing_link(slot, rid, ev, existing)
    if record.deleted:
        return _reject(slot, rid, R.SOURCE_DELETED, link_key=key)
    problem = evidence_problem(ev, slot.current_pair)
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
    conflict = _stored_conflict(p, locator_of(slot, ev.remote_id), facts)
    if conflict is None and locator_of(slot, ev.remote_id) in contested_locators:
        conflict = (R.REMOTE_ID_CLAIMED_TWICE, "another local record claims the same remote id")
    if conflict is not None:
        return _reject(slot, rid, conflict[0], conflict[1], **found, via_slot=via)
    return _decision(slot, rid, Outcome.ADOPTABLE, **found, via_slot=via)


def _existing_link(
    slot: BackfillSlot, record_id: str, ev: Evidence, link: LinkFact
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
    p: Prepared, locator: Locator, facts: StoredFacts
) -> tuple[RejectReason, str] | None:
    key, keys = p.key, p.keys
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
    items: Sequence[tuple[BackfillSlot, LegacyRecord]] | Sequence[Prepared],
    facts: StoredFacts,
    contested_locators: frozenset[Locator] = frozenset(),
) -> tuple[RecordDecision, ...]:
    """Every record of one batch; locators claimed twice inside it are contested too."""
    prepared = [i if isinstance(i, Prepared) else prepare([i])[0] for i in items]
    everywhere = contested_locators | claimed_twice(p.claims for p in prepared)
    return tuple(_decide(p, facts, everywhere) for p in prepared)


class Totals(Snapshot):
    adoptable: int = 0
    adopted: int = 0
    already_adopted: int = 0
    skipped: int = 0
    rejected: int = 0


def totals(decisions: Iterable[RecordDecision]) -> Totals:
    counts = Counter(d.outcome.value for d in decisions)
    return Totals.model_validate(dict(counts))
