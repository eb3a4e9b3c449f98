"""GATE-1 prior-ownership gate (issue 15; SPEC GATE-1, ID-6; seed "Stable Slot Identity",
drift row "Flow action removed/recreated with new or missing ActionSlotId", "Retry And
Recovery" 9): a recomputed key that found no rows never proves the record owns nothing.

The demo's contact slot `push-contact` declares `push-contact-v0` as its lineage
(a rebind), so rows under `push-contact-v0` are ID-6's and never this gate's.
"""

from __future__ import annotations

from typing import Any

import pytest

from protocol.admission import (
    CreateReserved,
    PackSlots,
    RecordOwnershipRow,
    RecordView,
    Rejected,
)
from protocol.errors import RejectReason
from protocol.gates import decide_admission
from protocol.identity import link_key
from protocol.states import AttemptStatus, LinkStatus
from tests.unit.factories import contact_context, demo_manifest

OWNER, RECORD = "demo-owner", "003A"
FIELDS = {"Email": "a@example.com", "FirstName": "Ada", "LastName": "L", "Phone": "1"}


def key_under(slot: str, destination: str = "remote-contacts") -> str:
    return link_key(OWNER, slot, "Contact", RECORD, destination)


OWN_KEY = key_under("push-contact")


def row(slot: str, destination: str = "remote-contacts", **status: Any) -> RecordOwnershipRow:
    return RecordOwnershipRow(
        link_key=key_under(slot, destination),
        action_slot_id=slot,
        destination_slot_id=destination,
        **status,
    )


def decide(rows: tuple[RecordOwnershipRow, ...] = (), **mirror: str) -> Any:
    record = RecordView(exists=True, fields={**FIELDS, **mirror})
    slots = PackSlots.of(demo_manifest())
    return decide_admission(contact_context(record_rows=rows, record=record, pack_slots=slots))


def refused(decision: Any) -> str:
    assert isinstance(decision, Rejected), decision
    assert decision.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN
    return decision.detail


# -- rows under another slot ---------------------------------------------------------


# A link that is not retired, or an attempt that is not released: each may own the
# record's remote object.
LIVE = pytest.mark.parametrize(
    "status",
    [
        {"link_status": LinkStatus.FINALIZED, "remote_id": "1001"},
        {"link_status": LinkStatus.SUSPENDED_DRIFT, "remote_id": "1001"},
        {"attempt_status": AttemptStatus.PENDING},
        {"attempt_status": AttemptStatus.PROCESSING},
        {"attempt_status": AttemptStatus.WRITEBACK_PENDING},
        {"attempt_status": AttemptStatus.AMBIGUOUS_REMOTE_EFFECT},
        {"attempt_status": AttemptStatus.TERMINAL_FAILED},
    ],
    ids=["finalized", "suspended", "pending", "processing", "writeback", "ambiguous", "terminal"],
)


@LIVE
def test_a_live_row_under_another_slot_at_this_destination_refuses(status: Any) -> None:
    detail = refused(decide((row("push-contact-old", **status),)))
    assert key_under("push-contact-old") in detail and "'push-contact-old'" in detail


@LIVE
def test_a_live_row_of_this_action_slot_at_another_destination_refuses(status: Any) -> None:
    """Seed drift rows "connector profile ... recreated with new DestinationSlotId" and
    "target object changes with new/missing DestinationSlotId": the action slot now names a
    new destination slot, so the save's key is new and finds no rows; the row under the old
    destination may own the record's remote object (its mirror may never have been
    written). Fail closed: no name-derived replacement attempt."""
    old = row("push-contact", "remote-contacts-old", **status)
    detail = refused(decide((old,)))
    assert old.link_key in detail and "'remote-contacts-old'" in detail


@LIVE
@pytest.mark.parametrize(
    ("slot", "destination"),
    [
        ("push-deal-old", "remote-deals-old"),
        ("push-deal-old", "remote-deals"),
        ("push-deal", "remote-deals-old"),
    ],
    ids=["both-slots-gone", "action-slot-gone", "destination-slot-gone"],
)
def test_a_live_row_under_a_slot_the_pack_no_longer_has_refuses(
    status: Any, slot: str, destination: str
) -> None:
    """SPEC C-6, seed row P-08 (000 "Link Key": never reserve a fresh create merely because
    a recomputed key found no rows): a live link, or a live or ambiguous attempt, of this
    record under an action or destination slot the active pack no longer has (removed,
    or recreated under a new id without a declared rebind) may own the remote object this
    create would make again. Refused until it is retired, superseded or rebound."""
    old = row(slot, destination, **status)
    detail = refused(decide((old,)))
    assert old.link_key in detail and f"'{slot}'" in detail and f"'{destination}'" in detail


def test_the_refusal_names_every_row_found() -> None:
    rows = (
        row("push-contact-old", link_status=LinkStatus.FINALIZED, remote_id="1001"),
        row("push-contact-older", attempt_status=AttemptStatus.PENDING),
    )
    detail = refused(decide(rows))
    assert "1001" in detail and "finalized" in detail and "pending" in detail


@pytest.mark.parametrize(
    "resolved",
    [
        row("push-contact-old", link_status=LinkStatus.RETIRED, remote_id="1001"),
        row("push-contact-old", attempt_status=AttemptStatus.SUPERSEDED),
        row("push-contact-old", attempt_status=AttemptStatus.FINALIZED),
        # Another slot pair the active pack still has, at another destination: another
        # remote object, not this one's prior owner. (A pair the pack no longer has is
        # C-6's: test_a_live_row_under_a_slot_the_pack_no_longer_has_refuses.)
        row("push-deal", "remote-deals", link_status=LinkStatus.FINALIZED, remote_id="7"),
        # A slot pair the pack no longer has, once its rows are resolved.
        row("push-deal-old", "remote-deals-old", link_status=LinkStatus.RETIRED, remote_id="7"),
        row("push-deal-old", "remote-deals-old", attempt_status=AttemptStatus.SUPERSEDED),
        # This action slot's old destination, once its link is retired (the way out).
        row("push-contact", "remote-contacts-old", link_status=LinkStatus.RETIRED),
        row("push-contact", "remote-contacts-old", attempt_status=AttemptStatus.SUPERSEDED),
        # The declared lineage: ID-6 decides those rows (LineageRow), not this gate.
        row("push-contact-v0", link_status=LinkStatus.FINALIZED, remote_id="1001"),
    ],
    ids=[
        "retired",
        "superseded",
        "finalized-attempt",
        "other-destination",
        "removed-pair-retired",
        "removed-pair-superseded",
        "old-destination-retired",
        "old-destination-superseded",
        "lineage",
    ],
)
def test_resolved_or_unrelated_rows_do_not_refuse(resolved: RecordOwnershipRow) -> None:
    assert isinstance(decide((resolved,)), CreateReserved)


# -- evidence in this slot's mirror field pair ---------------------------------------


def test_a_remote_id_in_the_mirror_refuses_without_any_row() -> None:
    """The renamed-slot defect: the old link's key is not recomputed, but the record
    still carries the remote id its mirror wrote."""
    assert "remote_id__c='1001'" in refused(decide(remote_id__c="1001"))


@pytest.mark.parametrize(
    "provenance",
    [key_under("push-contact-old"), f"{OWNER}:push-contact:remote-contacts"],
    ids=["another-link-key", "legacy-marker"],
)
def test_a_provenance_naming_another_owner_of_this_destination_refuses(provenance: str) -> None:
    assert provenance in refused(decide(remote_provenance__c=provenance))


@pytest.mark.parametrize(
    "provenance",
    [OWN_KEY, "other-owner:push-contact:remote-contacts", f"{OWNER}:push-x:remote-leads", "x"],
    ids=["own-key", "other-owner", "other-destination", "unrecognised"],
)
def test_a_provenance_naming_nothing_of_this_destination_is_no_evidence(provenance: str) -> None:
    assert isinstance(decide(remote_provenance__c=provenance), CreateReserved)


def test_a_retired_link_explains_the_mirror_it_wrote() -> None:
    """The operator's way out "retire the old link": the evidence is then explained."""
    old = row("push-contact-old", link_status=LinkStatus.RETIRED, remote_id="1001")
    decision = decide((old,), remote_id__c="1001", remote_provenance__c=old.link_key)
    assert isinstance(decision, CreateReserved)


@pytest.mark.parametrize("status", [LinkStatus.FINALIZED, LinkStatus.RETIRED])
def test_a_lineage_link_does_not_explain_the_mirror_it_wrote(status: LinkStatus) -> None:
    """A declared rebind finds the old rows (ID-6) but does not move the remote object to
    this slot: until `backfill` adopts the remote id here, a create would be a second
    remote object for the record, the one the rebind was declared to keep. Retiring the
    old link is the procedure's middle step, not its end: a save between the retire and
    the backfill must not POST."""
    marker = f"{OWNER}:push-contact-v0:remote-contacts"
    old = row("push-contact-v0", link_status=status, remote_id="1001")
    detail = refused(decide((old,), remote_id__c="1001", remote_provenance__c=marker))
    assert "1001" in detail and marker in detail


def test_a_live_link_does_not_explain_a_mirror_of_another_remote_id() -> None:
    old = row("push-contact-old", link_status=LinkStatus.RETIRED, remote_id="1001")
    detail = refused(decide((old,), remote_id__c="2002", remote_provenance__c=old.link_key))
    assert "2002" in detail and old.link_key not in detail
