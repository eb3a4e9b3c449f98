"""Legacy-link adoption (SPEC MIG-1): the evidence a local record holds, and its provenance.

Rules 1-2 of the adoption rules (3-5, the decision, live in `protocol.backfill`):

1. Evidence is only what a local record materialised in a mirror pair
   (`remoteIdField`, `provenanceField`) of the action slot: the active
   install's pair, or a pair an earlier install of the same pack declared for
   this slot or a slot rebound into it. Nothing is inferred from names.
2. Exactly two provenance formats are accepted (`parse_provenance`): the
   runtime's own link key (`lk1_<64 hex>`, what services/mirror.py writes)
   and the legacy marker `"{ConnectorOwnerKey}:{ActionSlotId}:{DestinationSlotId}"`
   (exactly three valid stable ids; an id holding `:` makes a marker ambiguous,
   so it is not recognised). Anything else is `provenance_unrecognized`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Final

from pydantic import JsonValue

from protocol.backfill_facts import (
    BackfillSlot,
    LegacyRecord,
    Locator,
    ProvenanceFormat,
    RejectReason,
)
from protocol.identity import InvalidIdentityPart, check_part
from protocol.manifest import MirrorSpec
from protocol.remote_ids import RemoteIdError, check_remote_id
from protocol.snapshots import Snapshot

LINK_KEY_PROVENANCE: Final = re.compile(r"lk1_[0-9a-f]{64}")
MARKER_SEPARATOR: Final = ":"

R = RejectReason


class Provenance(Snapshot):
    format: ProvenanceFormat
    value: str
    connector_owner_key: str | None = None
    action_slot_id: str | None = None
    destination_slot_id: str | None = None


class Evidence(Snapshot):
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


# -- evidence -----------------------------------------------------------------------------


def _canonical(name: str, value: str) -> str | None:
    """PROF-4: a remote id (and a provenance) is adopted only in canonical form."""
    try:
        return check_remote_id(check_part(name, value))
    except (InvalidIdentityPart, RemoteIdError):
        return None


def _text(fields: dict[str, JsonValue], name: str, malformed: list[str]) -> str | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, str) and (canonical := _canonical(name, value)) is not None:
        return canonical
    malformed.append(name)
    return None


def evidence(slot: BackfillSlot, record: LegacyRecord) -> Evidence:
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
    return Evidence(
        remote_id=current[0],
        provenance=current[1],
        earlier_remote_ids=tuple(earlier_ids),
        earlier_provenances=tuple(earlier_provs),
        malformed=tuple(sorted(set(malformed))),
    )


def evidence_problem(ev: Evidence, pair: MirrorSpec) -> tuple[RejectReason, str] | None:
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
    return claims_in(slot, evidence(slot, record))


def claims_in(slot: BackfillSlot, ev: Evidence) -> frozenset[Locator]:
    """`claims`, from the record's evidence already read."""
    return frozenset(locator_of(slot, rid) for rid in ev.remote_ids)


def claim_fields(slot: BackfillSlot) -> tuple[str, ...]:
    """The fields `claims` reads: the remote-id field of the current and earlier pairs."""
    pairs = (slot.current_pair, *slot.earlier_pairs)
    return tuple(dict.fromkeys(pair.remote_id_field for pair in pairs))


def is_claim(value: str) -> bool:
    """Whether a string held in one of `claim_fields` is a claim (`claims` counts it)."""
    return value != "" and _canonical("remote id", value) is not None


def locator_of(slot: BackfillSlot, remote_id: str) -> Locator:
    return Locator(
        connector_owner_key=slot.connector_owner_key,
        destination_slot_id=slot.destination_slot_id,
        remote_scope=slot.remote_scope,
        remote_id=remote_id,
    )


def contested(items: Iterable[tuple[BackfillSlot, LegacyRecord]]) -> frozenset[Locator]:
    """Locators claimed by more than one (slot, record): none of their claimants is adopted."""
    return claimed_twice(claims(slot, record) for slot, record in items)


def claimed_twice(claim_sets: Iterable[frozenset[Locator]]) -> frozenset[Locator]:
    """`contested`, from each claimant's claims."""
    counts: Counter[Locator] = Counter()
    for found in claim_sets:
        counts.update(found)
    return frozenset(locator for locator, n in counts.items() if n > 1)
