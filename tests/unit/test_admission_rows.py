"""Seed rows P-57 and P-71 over the pure admission gates (SPEC GATE-1, LANE-2).

P-57 (000:317-319): "Missing update-only association targets still fail admission even
when an earlier create-inline target is also pending": Rejected
`association_target_missing`, never a deferred reservation.
P-71 (000:348-349): fail closed before the POST when the profile, credential, endpoint
class, target object or responseIdPath "cannot be frozen": `freeze_failed`, for each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import (
    AssociationTarget,
    CreateReserved,
    DeferredAssociationReserved,
    RecordView,
    Rejected,
    SaveRequest,
)
from protocol.authority import PermissionFacts
from protocol.errors import RejectReason
from protocol.gates import decide_admission
from protocol.states import LinkStatus
from tests.unit.factories import INSTALL, contact_active, contact_context, demo_manifest

R = RejectReason
INLINE, UPDATE_ONLY = "primary-contact", "billing-contact"
FIELDS = frozenset({"Name", "Website", "PrimaryContactId", "BillingContactId"})


def _two_associations(update_only_first: bool) -> ActiveMetadata:
    """The demo's company slot with its create-inline association and an update-only one."""

    def add(document: dict[str, Any]) -> None:
        associations = document["actionSlots"][1]["associations"]
        update_only = {
            "id": UPDATE_ONLY,
            "sourceField": "BillingContactId",
            "targetActionSlot": "push-contact",
            "mode": "update_only",
            "remoteProperty": "billing_contact_id",
        }
        associations.insert(0 if update_only_first else 1, update_only)

    return resolve_active(demo_manifest(add), INSTALL, "push-company")


def _company(active: ActiveMetadata, targets: dict[str, AssociationTarget]) -> Any:
    save = SaveRequest(
        connector_owner_key="demo-owner",
        action_slot_id="push-company",
        destination_slot_id="remote-companies",
        source_object="Account",
        source_record_id="001A",
        originating_user_id="user-1",
    )
    record = RecordView(
        exists=True,
        fields={"Name": "Acme", "PrimaryContactId": "003A", "BillingContactId": "003B"},
    )
    facts = PermissionFacts(object_readable=True, record_readable=True, readable_fields=FIELDS)
    return decide_admission(
        contact_context(
            active=active,
            save=save,
            record=record,
            permissions=facts,
            association_targets=targets,
        )
    )


FINALIZED = AssociationTarget(link_status=LinkStatus.FINALIZED, remote_id="901")


@pytest.mark.parametrize("update_only_first", [False, True], ids=["inline-first", "update-first"])
@pytest.mark.parametrize(
    "inline_target",
    [None, AssociationTarget(link_status=LinkStatus.SUSPENDED_DRIFT, remote_id="900")],
    ids=["unlinked", "not-finalized"],
)
def test_a_missing_update_only_target_rejects_even_with_an_inline_target_pending(
    update_only_first: bool, inline_target: AssociationTarget | None
) -> None:
    """P-57: create-inline target pending plus update-only target missing: rejected."""
    targets = {INLINE: inline_target} if inline_target else {}
    decision = _company(_two_associations(update_only_first), targets)
    assert isinstance(decision, Rejected), decision
    assert decision.reason is R.ASSOCIATION_TARGET_MISSING
    assert UPDATE_ONLY in decision.detail and INLINE not in decision.detail


@pytest.mark.parametrize("update_only_first", [False, True], ids=["inline-first", "update-first"])
def test_with_the_update_only_target_linked_the_inline_one_defers(update_only_first: bool) -> None:
    """The control: the rejection above is the update-only target's alone."""
    decision = _company(_two_associations(update_only_first), {UPDATE_ONLY: FINALIZED})
    assert isinstance(decision, DeferredAssociationReserved), decision
    assert decision.waiting_on == (INLINE,)
    both = _company(
        _two_associations(update_only_first), {UPDATE_ONLY: FINALIZED, INLINE: FINALIZED}
    )
    assert isinstance(both, CreateReserved), both


# -- P-71 --------------------------------------------------------------------------------

Unavailable = Callable[[ActiveMetadata], ActiveMetadata]


def _without(part: str, field: str) -> Unavailable:
    """`active` with one frozen input of `part` (action, destination, profile) empty, as a
    context built without the manifest's validation could carry it."""

    def strip(active: ActiveMetadata) -> ActiveMetadata:
        model = getattr(active, part)
        return active.model_copy(update={part: model.model_copy(update={field: ""})})

    return strip


UNAVAILABLE = {
    "credentialRef": _without("profile", "credential_ref"),
    "targetObject": _without("destination", "target_object"),
    "responseIdPath": _without("action", "response_id_path"),
    "endpointClass": _without("profile", "endpoint_class"),
}


@pytest.mark.parametrize("missing", list(UNAVAILABLE))
def test_a_create_whose_snapshot_is_unavailable_fails_to_freeze(missing: str) -> None:
    """P-71: each unavailable snapshot input rejects `freeze_failed`, before any reservation."""
    decision = decide_admission(contact_context(active=UNAVAILABLE[missing](contact_active())))
    assert isinstance(decision, Rejected), decision
    assert decision.reason is R.FREEZE_FAILED
    assert decision.link_key is not None


def test_the_same_context_with_every_snapshot_available_reserves() -> None:
    """The control: the contexts above differ from a reserving one in that field only."""
    assert isinstance(decide_admission(contact_context()), CreateReserved)
