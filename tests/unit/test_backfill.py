"""Legacy-link adoption decisions (MIG-1), driven directly on the pure protocol."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import JsonValue

from protocol.backfill import decide_batch, decide_record, lookups, totals
from protocol.backfill_evidence import contested, parse_provenance
from protocol.backfill_facts import (
    AttemptFact,
    BackfillSlot,
    LegacyRecord,
    LinkFact,
    Locator,
    Outcome,
    ProvenanceFormat,
    RejectReason,
    StoredFacts,
    backfill_slot,
)
from protocol.identity import link_key
from protocol.manifest import PackManifest
from protocol.states import AttemptStatus, LinkStatus
from tests.unit.factories import contact_active, demo_manifest

R = RejectReason
OWNER, SLOT, DEST = "demo-owner", "push-contact", "remote-contacts"
RID, PROV = "remote_id__c", "remote_provenance__c"
MARKER = f"{OWNER}:{SLOT}:{DEST}"
LEGACY = {"remoteIdField": "legacy_id__c", "provenanceField": "legacy_prov__c"}


def _legacy_mirror(document: dict[str, Any]) -> None:
    document["actionSlots"][0]["mirror"] = LEGACY


def _no_lineage(document: dict[str, Any]) -> None:
    document["lineage"] = []


def slot(manifest: PackManifest | None = None, *earlier: PackManifest) -> BackfillSlot:
    manifest = manifest or demo_manifest()
    return backfill_slot(manifest, contact_active(manifest), earlier)


def record(fields: dict[str, JsonValue], record_id: str = "c-1", **extra: Any) -> LegacyRecord:
    return LegacyRecord(source_object="Contact", record_id=record_id, fields=fields, **extra)


def key(record_id: str = "c-1", action_slot: str = SLOT, destination: str = DEST) -> str:
    return link_key(OWNER, action_slot, "Contact", record_id, destination)


def locator(remote_id: str, destination: str = DEST) -> Locator:
    return Locator(
        connector_owner_key=OWNER,
        destination_slot_id=destination,
        remote_scope="sandbox-portal",
        remote_id=remote_id,
    )


def link(link_key_: str, remote_id: str, status: LinkStatus = LinkStatus.FINALIZED) -> LinkFact:
    return LinkFact(
        link_key=link_key_, action_slot_id=SLOT, locator=locator(remote_id), status=status
    )


def decide(fields: dict[str, JsonValue], facts: StoredFacts | None = None, **kw: Any) -> Any:
    return decide_record(
        kw.pop("slot", None) or slot(), record(fields, **kw), facts or StoredFacts()
    )


# -- provenance formats --------------------------------------------------------------


def test_exactly_two_provenance_formats_are_recognised() -> None:
    own = parse_provenance(key())
    marker = parse_provenance(MARKER)
    assert own is not None and own.format is ProvenanceFormat.LINK_KEY
    assert marker is not None and marker.format is ProvenanceFormat.LEGACY_MARKER
    assert (marker.connector_owner_key, marker.action_slot_id, marker.destination_slot_id) == (
        OWNER,
        SLOT,
        DEST,
    )


@pytest.mark.parametrize(
    "value",
    [
        "hubspot-sync",
        f"{OWNER}:{SLOT}",  # two parts
        f"{OWNER}:{SLOT}:{DEST}:extra",  # an id holding ':' is ambiguous
        f"{OWNER}: {SLOT}:{DEST}",  # padded id
        f"{OWNER}::{DEST}",  # empty id
        "lk1_" + "A" * 64,  # not the runtime's key encoding
        "lk2_" + "a" * 64,
    ],
)
def test_anything_else_is_unrecognised(value: str) -> None:
    assert parse_provenance(value) is None
    decision = decide({RID: "r-1", PROV: value})
    assert (decision.outcome, decision.reason) == (Outcome.REJECTED, R.PROVENANCE_UNRECOGNIZED)


# -- adoptable ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provenance", "fmt"),
    [(MARKER, ProvenanceFormat.LEGACY_MARKER), (key(), ProvenanceFormat.LINK_KEY)],
)
def test_one_remote_id_and_one_provenance_for_this_slot_is_adoptable(
    provenance: str, fmt: ProvenanceFormat
) -> None:
    decision = decide({RID: "r-1", PROV: provenance})
    assert decision.outcome is Outcome.ADOPTABLE
    assert (decision.link_key, decision.remote_id, decision.provenance_format) == (
        key(),
        "r-1",
        fmt,
    )
    assert decision.via_slot == SLOT


@pytest.mark.parametrize(
    "provenance",
    [f"{OWNER}:push-contact-v0:{DEST}", key(action_slot="push-contact-v0")],
    ids=["marker", "link_key"],
)
def test_a_rebound_predecessor_slot_is_adoptable_under_the_current_key(provenance: str) -> None:
    decision = decide({RID: "r-1", PROV: provenance})
    assert (decision.outcome, decision.via_slot, decision.link_key) == (
        Outcome.ADOPTABLE,
        "push-contact-v0",
        key(),
    )


def test_without_the_rebind_the_old_slot_is_another_slot() -> None:
    unbound = slot(demo_manifest(_no_lineage))
    decision = decide({RID: "r-1", PROV: f"{OWNER}:push-contact-v0:{DEST}"}, slot=unbound)
    assert decision.reason is R.PROVENANCE_FOR_OTHER_SLOT


def test_an_earlier_pair_holding_the_same_values_is_agreement_not_ambiguity() -> None:
    with_history = slot(demo_manifest(), demo_manifest(_legacy_mirror))
    fields: dict[str, JsonValue] = {RID: "r-1", PROV: MARKER, "legacy_id__c": "r-1"}
    assert decide(fields, slot=with_history).outcome is Outcome.ADOPTABLE


# -- skipped and already adopted ---------------------------------------------------------


@pytest.mark.parametrize("fields", [{}, {RID: "", PROV: None}, {"Email": "a@example.com"}])
def test_no_evidence_is_skipped_not_rejected(fields: dict[str, JsonValue]) -> None:
    decision = decide(fields)
    assert (decision.outcome, decision.reason) == (
        Outcome.SKIPPED,
        R.NO_REMOTE_ID_AND_NO_PROVENANCE,
    )


def test_a_link_with_the_same_remote_id_is_already_adopted() -> None:
    facts = StoredFacts(links=(link(key(), "r-1"),), locator_owners=(link(key(), "r-1"),))
    decision = decide({RID: "r-1", PROV: MARKER}, facts)
    assert (decision.outcome, decision.link_key) == (Outcome.ALREADY_ADOPTED, key())


def test_a_link_with_another_remote_id_is_reported() -> None:
    decision = decide({RID: "r-2", PROV: MARKER}, StoredFacts(links=(link(key(), "r-1"),)))
    assert decision.reason is R.LINK_EXISTS_WITH_OTHER_REMOTE_ID


# -- every ambiguous case fails closed -----------------------------------------------------

OTHER = f"{OWNER}:push-lead:{DEST}"
EARLIER = (demo_manifest(_legacy_mirror),)

CASES: list[tuple[str, dict[str, JsonValue], tuple[PackManifest, ...], RejectReason]] = [
    ("provenance_only", {PROV: MARKER}, (), R.PROVENANCE_WITHOUT_REMOTE_ID),
    ("remote_id_only", {RID: "r-1"}, (), R.REMOTE_ID_WITHOUT_PROVENANCE),
    ("other_slot", {RID: "r-1", PROV: OTHER}, (), R.PROVENANCE_FOR_OTHER_SLOT),
    (
        "other_slot_key",
        {RID: "r-1", PROV: key(action_slot="push-company")},
        (),
        R.PROVENANCE_FOR_OTHER_SLOT,
    ),
    (
        "other_owner",
        {RID: "r-1", PROV: f"acme:{SLOT}:{DEST}"},
        (),
        R.PROVENANCE_FOR_OTHER_OWNER,
    ),
    (
        "destination",
        {RID: "r-1", PROV: f"{OWNER}:{SLOT}:remote-deals"},
        (),
        R.DESTINATION_CHANGED,
    ),
    (
        "destination_key",
        {RID: "r-1", PROV: key(destination="remote-deals")},
        (),
        R.DESTINATION_CHANGED,
    ),
    (
        "another_records_key",
        {RID: "r-1", PROV: key("c-2")},
        (),
        R.PROVENANCE_KEY_MISMATCH,
    ),
    (
        "outside_current_pair",
        {"legacy_id__c": "r-1", "legacy_prov__c": MARKER},
        EARLIER,
        R.REMOTE_ID_OUTSIDE_CURRENT_FIELD_PAIR,
    ),
    (
        "provenance_outside_current_pair",
        {RID: "r-1", "legacy_prov__c": MARKER},
        EARLIER,
        R.REMOTE_ID_OUTSIDE_CURRENT_FIELD_PAIR,
    ),
    (
        "two_remote_ids",
        {RID: "r-1", PROV: MARKER, "legacy_id__c": "r-2"},
        EARLIER,
        R.MULTIPLE_CANDIDATE_REMOTE_IDS,
    ),
    (
        "two_provenances",
        {RID: "r-1", PROV: MARKER, "legacy_prov__c": key()},
        EARLIER,
        R.MULTIPLE_CANDIDATE_PROVENANCES,
    ),
    ("number", {RID: 12345, PROV: MARKER}, (), R.MALFORMED_MIRROR_VALUE),
    ("padded", {RID: " r-1", PROV: MARKER}, (), R.MALFORMED_MIRROR_VALUE),
]


@pytest.mark.parametrize(
    ("fields", "earlier", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_ambiguous_evidence_is_rejected_with_its_reason(
    fields: dict[str, JsonValue], earlier: tuple[PackManifest, ...], reason: RejectReason
) -> None:
    decision = decide(fields, slot=slot(demo_manifest(), *earlier))
    assert (decision.outcome, decision.reason) == (Outcome.REJECTED, reason), decision.detail


def test_earlier_pairs_come_only_from_this_slot_and_its_predecessors() -> None:
    def company_pair(document: dict[str, Any]) -> None:
        document["actionSlots"][1]["mirror"] = LEGACY

    unrelated = slot(demo_manifest(), demo_manifest(company_pair))
    assert unrelated.earlier_pairs == ()
    fields: dict[str, JsonValue] = {RID: "r-1", PROV: MARKER, "legacy_id__c": "r-2"}
    assert decide(fields, slot=unrelated).outcome is Outcome.ADOPTABLE


def test_a_deleted_source_with_evidence_is_rejected() -> None:
    decision = decide({RID: "r-1", PROV: MARKER}, deleted=True)
    assert decision.reason is R.SOURCE_DELETED
    assert decide({}, deleted=True).outcome is Outcome.SKIPPED


def test_an_invalid_record_id_is_rejected_not_keyed() -> None:
    decision = decide({RID: "r-1", PROV: MARKER}, record_id=" c-1")
    assert (decision.reason, decision.link_key) == (R.INVALID_RECORD_ID, None)


@pytest.mark.parametrize("action_slot", [SLOT, "push-contact-v0"])
def test_any_attempt_for_the_key_or_a_predecessor_key_blocks_adoption(action_slot: str) -> None:
    attempt = AttemptFact(
        link_key=key(action_slot=action_slot), attempt_id="a-1", status=AttemptStatus.SUPERSEDED
    )
    decision = decide({RID: "r-1", PROV: MARKER}, StoredFacts(attempts=(attempt,)))
    assert decision.reason is R.ATTEMPT_EXISTS


def test_a_finalized_attempt_of_a_retired_predecessor_link_does_not_block_adoption() -> None:
    """Issue 15 (GATE-1's way out): a slot renamed with a declared rebind adopts the remote
    object of the retired old link; the old link's finalized attempt is that link's past."""
    old_key = key(action_slot="push-contact-v0")
    attempt = AttemptFact(link_key=old_key, attempt_id="a-1", status=AttemptStatus.FINALIZED)
    retired = link(old_key, "r-1", LinkStatus.RETIRED)
    facts = StoredFacts(links=(retired,), attempts=(attempt,))
    assert decide({RID: "r-1", PROV: MARKER}, facts).outcome is Outcome.ADOPTABLE


def test_a_predecessor_link_to_another_remote_object_blocks_adoption() -> None:
    old = link(key(action_slot="push-contact-v0"), "r-9")
    decision = decide({RID: "r-1", PROV: MARKER}, StoredFacts(links=(old,)))
    assert decision.reason is R.LINK_EXISTS_WITH_OTHER_REMOTE_ID


def test_a_locator_owned_by_another_key_is_claimed_twice_unless_that_link_is_retired() -> None:
    fields: dict[str, JsonValue] = {RID: "r-1", PROV: MARKER}
    owned = StoredFacts(locator_owners=(link(key("c-2"), "r-1"),))
    retired = StoredFacts(locator_owners=(link(key("c-2"), "r-1", LinkStatus.RETIRED),))
    assert decide(fields, owned).reason is R.REMOTE_ID_CLAIMED_TWICE
    assert decide(fields, retired).outcome is Outcome.ADOPTABLE


def test_two_records_claiming_one_remote_id_are_both_rejected() -> None:
    s = slot()
    items = [
        (s, record({RID: "r-1", PROV: MARKER}, "c-1")),
        (s, record({RID: "r-1"}, "c-2")),  # evidence too weak to adopt, still a claim
        (s, record({RID: "r-3", PROV: MARKER}, "c-3")),
    ]
    decided = decide_batch(items, StoredFacts())
    assert [(d.record_id, d.reason) for d in decided] == [
        ("c-1", R.REMOTE_ID_CLAIMED_TWICE),
        ("c-2", R.REMOTE_ID_WITHOUT_PROVENANCE),
        ("c-3", None),
    ]
    assert contested(items) == {locator("r-1")}


def test_a_locator_contested_outside_the_batch_is_rejected_too() -> None:
    decision = decide_record(
        slot(), record({RID: "r-1", PROV: MARKER}), StoredFacts(), frozenset({locator("r-1")})
    )
    assert decision.reason is R.REMOTE_ID_CLAIMED_TWICE


def test_lookups_name_this_key_predecessor_keys_and_claimed_locators_in_key_order() -> None:
    s = slot()
    wanted = lookups([(s, record({RID: "r-1"}, "c-1")), (s, record({}, "c-2"))])
    expected = {
        key("c-1"),
        key("c-2"),
        key("c-1", "push-contact-v0"),
        key("c-2", "push-contact-v0"),
    }
    assert wanted.link_keys == tuple(sorted(expected))
    assert wanted.locators == (locator("r-1"),)


def test_totals_count_each_outcome() -> None:
    s = slot()
    decided = decide_batch(
        [(s, record({}, "c-1")), (s, record({RID: "r-1", PROV: MARKER}, "c-2"))], StoredFacts()
    )
    assert totals(decided).model_dump() == {
        "adoptable": 1,
        "adopted": 0,
        "already_adopted": 0,
        "skipped": 1,
        "rejected": 0,
    }
