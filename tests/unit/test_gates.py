"""GATE-1 / PATCH-1 / LANE-2 / LANE-4: one test per condition."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.active import resolve_active
from protocol.admission import (
    AssociationTarget,
    AttemptSummary,
    CreateReserved,
    DeferredAssociationReserved,
    LineageRow,
    ObservedActiveAttempt,
    PatchQueued,
    RecordView,
    Rejected,
    SaveRequest,
)
from protocol.authority import PermissionFacts
from protocol.canonical import canonical_json, sha256_hex
from protocol.drift import DriftSurface
from protocol.errors import RejectReason
from protocol.gates import association_lookups, decide_admission, decide_patch
from protocol.identity import link_key
from protocol.request import complete_deferred_request
from protocol.states import AttemptStatus, DispatchLane, LinkStatus
from tests.unit.factories import (
    CONTACT_FIELDS,
    INSTALL,
    contact_active,
    contact_context,
    contact_link,
    demo_manifest,
)

R = RejectReason


def reason(**overrides: Any) -> RejectReason:
    decision = decide_admission(contact_context(**overrides))
    assert isinstance(decision, Rejected), decision
    return decision.reason


def test_happy_path_reserves_a_frozen_create() -> None:
    decision = decide_admission(contact_context())
    assert isinstance(decision, CreateReserved)
    r = decision.reservation
    assert r.link_key == link_key(
        "demo-owner", "push-contact", "Contact", "003A", "remote-contacts"
    )
    assert r.dispatch_lane is DispatchLane.CONFIGURED
    req = r.request
    assert (req.method, req.relative_path) == ("POST", "/crm/v3/objects/contacts")
    assert req.headers == {"Idempotency-Key": "idem-1"}
    assert req.body == {
        "properties": {"email": "a@example.com", "firstname": "Ada", "lastname": "L", "phone": "1"}
    }
    assert req.body_hash == sha256_hex(canonical_json(req.body))
    assert req.response_id_path == "$.id" and req.idempotency_key == "idem-1"
    assert r.authority.allowed_fields == tuple(sorted(CONTACT_FIELDS))


def test_no_trusted_slot() -> None:
    assert reason(active=None) is R.NO_TRUSTED_SLOT
    missing = resolve_active(demo_manifest(), INSTALL, "push-nothing")
    assert reason(active=missing) is R.NO_TRUSTED_SLOT


def test_stable_ids_unresolved() -> None:
    base = contact_context().save
    other_owner = base.model_copy(update={"connector_owner_key": "someone-else"})
    assert reason(save=other_owner) is R.STABLE_IDS_UNRESOLVED
    blank_record = base.model_copy(update={"source_record_id": " 003A"})
    assert reason(save=blank_record) is R.STABLE_IDS_UNRESOLVED


def test_no_authority_snapshot() -> None:
    assert reason(permissions=None) is R.NO_AUTHORITY
    save = contact_context().save.model_copy(update={"originating_user_id": None})
    assert reason(save=save) is R.NO_AUTHORITY


def test_pack_not_single_active() -> None:
    assert reason(active_incarnations=2) is R.PACK_NOT_SINGLE_ACTIVE
    assert reason(active_incarnations=0) is R.PACK_NOT_SINGLE_ACTIVE


def test_mapping_absent_or_duplicated() -> None:
    active = contact_active()
    assert active.action is not None
    empty = active.action.model_copy(update={"mappings": ()})
    assert reason(active=active.model_copy(update={"action": empty})) is R.MAPPING_INVALID
    dup = active.action.model_copy(update={"mappings": active.action.mappings * 2})
    assert reason(active=active.model_copy(update={"action": dup})) is R.MAPPING_INVALID


def test_mapping_producing_no_body() -> None:
    record = RecordView(exists=True, fields={"Email": None})
    assert reason(record=record) is R.REQUIRED_FIELD_MISSING
    optional = contact_active()
    assert optional.action is not None
    rows = tuple(m.model_copy(update={"required": False}) for m in optional.action.mappings)
    active = optional.model_copy(
        update={"action": optional.action.model_copy(update={"mappings": rows})}
    )
    assert reason(active=active, record=RecordView(exists=True, fields={})) is R.EMPTY_BODY


def test_record_derived_path_template() -> None:
    active = contact_active()
    assert active.action is not None
    bad = active.action.model_copy(update={"create_path": "/objects/{record.Type}"})
    assert reason(active=active.model_copy(update={"action": bad})) is R.PATH_TEMPLATE_INVALID


def test_record_read_or_fls_fails() -> None:
    unreadable = PermissionFacts(
        object_readable=True, record_readable=False, readable_fields=CONTACT_FIELDS
    )
    assert reason(permissions=unreadable) is R.RECORD_UNREADABLE
    no_email = PermissionFacts(
        object_readable=True, record_readable=True, readable_fields=CONTACT_FIELDS - {"Email"}
    )
    assert reason(permissions=no_email) is R.FIELD_UNREADABLE


def test_source_record_deleted() -> None:
    assert reason(record=RecordView(exists=False, deleted=True)) is R.SOURCE_DELETED


def test_a_record_that_never_existed_is_not_found_not_deleted() -> None:
    # Issue 13: a typo'd record id must not read as a deletion.
    assert reason(record=RecordView(exists=False)) is R.SOURCE_NOT_FOUND


@pytest.mark.parametrize(
    ("status", "expected"),
    [(LinkStatus.SUSPENDED_DRIFT, R.LINK_SUSPENDED), (LinkStatus.RETIRED, R.LINK_RETIRED)],
)
def test_existing_suspended_or_retired_link_blocks(status: LinkStatus, expected: R) -> None:
    assert reason(link=contact_link(status)) is expected


def test_finalized_link_queues_patch_not_post() -> None:
    decision = decide_admission(contact_context(link=contact_link()))
    assert isinstance(decision, PatchQueued)
    assert decision.request.method == "PATCH"
    assert decision.request.relative_path == "/crm/v3/objects/contacts/901"
    assert decision.remote_id == "901"


@pytest.mark.parametrize(
    "status",
    [
        AttemptStatus.PENDING,
        AttemptStatus.PROCESSING,
        AttemptStatus.POST_SENT,
        AttemptStatus.AMBIGUOUS_REMOTE_EFFECT,
        AttemptStatus.WRITEBACK_PENDING,
    ],
)
def test_active_attempt_is_observed_never_posted(status: AttemptStatus) -> None:
    attempts = (AttemptSummary(attempt_id="att-1", status=status),)
    decision = decide_admission(contact_context(attempts=attempts))
    assert isinstance(decision, ObservedActiveAttempt)
    assert (decision.attempt_id, decision.status) == ("att-1", status)


def test_unsuperseded_terminal_attempt_blocks_create() -> None:
    terminal = (AttemptSummary(attempt_id="a1", status=AttemptStatus.TERMINAL_FAILED),)
    assert reason(attempts=terminal) is R.UNSUPERSEDED_TERMINAL_ATTEMPT
    superseded = (
        AttemptSummary(attempt_id="a1", status=AttemptStatus.SUPERSEDED),
        AttemptSummary(attempt_id="a2", status=AttemptStatus.SUPERSEDED, attempt_ordinal=2),
    )
    assert isinstance(decide_admission(contact_context(attempts=superseded)), CreateReserved)


def test_unresolved_lineage_blocks_create() -> None:
    live = (LineageRow(slot_id="push-contact-v0", link_status=LinkStatus.FINALIZED),)
    assert reason(lineage_rows=live) is R.LINEAGE_UNRESOLVED
    parked = (LineageRow(slot_id="push-contact-v0", attempt_status=AttemptStatus.TERMINAL_FAILED),)
    assert reason(lineage_rows=parked) is R.LINEAGE_UNRESOLVED
    resolved = (
        LineageRow(slot_id="push-contact-v0", link_status=LinkStatus.RETIRED),
        LineageRow(slot_id="push-contact-v0", attempt_status=AttemptStatus.SUPERSEDED),
        LineageRow(slot_id="push-contact-v0", link_status=LinkStatus.RETIRED, rebound=True),
    )
    assert isinstance(decide_admission(contact_context(lineage_rows=resolved)), CreateReserved)


def test_a_live_link_under_a_rebound_slot_blocks_a_create() -> None:
    """ID-6 + GATE-1: a rebind names the old rows but does not move their remote object;
    with the old link live (its mirror perhaps never written, so no mirror evidence) a
    create would be the record's second object. Retire it, then `backfill` adopts it."""
    for row in (
        LineageRow(slot_id="push-contact-v0", link_status=LinkStatus.FINALIZED, rebound=True),
        LineageRow(slot_id="push-contact-v0", link_status=LinkStatus.SUSPENDED_DRIFT, rebound=True),
        LineageRow(slot_id="push-contact-v0", attempt_status=AttemptStatus.PENDING, rebound=True),
    ):
        decision = decide_admission(contact_context(lineage_rows=(row,)))
        assert isinstance(decision, Rejected), row
        assert decision.reason is R.PRIOR_OWNERSHIP_UNCERTAIN
        assert "rebound slot 'push-contact-v0'" in (decision.detail or "")


def test_unfreezable_request_fails_closed() -> None:
    assert reason(idempotency_key="") is R.FREEZE_FAILED


def test_locator_profile_needs_a_locator_and_freezes_it() -> None:
    manifest = demo_manifest()
    active = resolve_active(manifest, INSTALL, "push-deal")
    save = SaveRequest(
        connector_owner_key="demo-owner",
        action_slot_id="push-deal",
        destination_slot_id="remote-deals",
        source_object="Opportunity",
        source_record_id="006A",
        originating_user_id="user-1",
    )
    facts = PermissionFacts(
        object_readable=True, record_readable=True, readable_fields=frozenset({"Name", "Amount"})
    )
    record = RecordView(exists=True, fields={"Name": "Big deal", "Amount": 10})
    common: dict[str, Any] = {"active": active, "save": save, "permissions": facts}
    assert reason(record=record, **common) is R.FREEZE_FAILED
    decision = decide_admission(contact_context(record=record, locator_value="loc-1", **common))
    assert isinstance(decision, CreateReserved)
    request = decision.reservation.request
    assert request.locator_value == "loc-1" and request.headers == {}
    assert isinstance(request.body, dict)
    assert request.body["properties"] == {
        "dealname": "Big deal",
        "amount": 10,
        "connector_push_locator": "loc-1",
    }


def _company(**overrides: Any) -> Any:
    active = resolve_active(demo_manifest(), INSTALL, "push-company")
    save = SaveRequest(
        connector_owner_key="demo-owner",
        action_slot_id="push-company",
        destination_slot_id="remote-companies",
        source_object="Account",
        source_record_id="001A",
        originating_user_id="user-1",
    )
    facts = PermissionFacts(
        object_readable=True,
        record_readable=True,
        readable_fields=frozenset({"Name", "Website", "PrimaryContactId"}),
    )
    record = RecordView(exists=True, fields={"Name": "Acme", "PrimaryContactId": "003A"})
    values: dict[str, Any] = {
        "active": active,
        "save": save,
        "permissions": facts,
        "record": record,
    }
    return decide_admission(contact_context(**(values | overrides)))


def test_create_inline_target_without_link_defers_with_full_vector() -> None:
    decision = _company()
    assert isinstance(decision, DeferredAssociationReserved)
    assert decision.waiting_on == ("primary-contact",)
    r = decision.reservation
    assert r.dispatch_lane is DispatchLane.DEFERRED_ASSOCIATION
    assert r.association_vector == ("003A",)
    completed = complete_deferred_request(
        r.request, "properties", {"primary-contact": ("primary_contact_id", "901")}
    )
    assert not isinstance(completed, type(None))
    assert getattr(completed, "body", None) == {
        "properties": {"name": "Acme", "primary_contact_id": "901"}
    }


def test_finalized_association_target_is_inlined() -> None:
    targets = {
        "primary-contact": AssociationTarget(link_status=LinkStatus.FINALIZED, remote_id="901")
    }
    decision = _company(association_targets=targets)
    assert isinstance(decision, CreateReserved)
    assert decision.reservation.request.body == {
        "properties": {"name": "Acme", "primary_contact_id": "901"}
    }


def test_blank_association_keeps_blank_vector_entry() -> None:
    record = RecordView(exists=True, fields={"Name": "Acme", "PrimaryContactId": None})
    decision = _company(record=record)
    assert isinstance(decision, CreateReserved)
    assert decision.reservation.association_vector == ("",)


def test_missing_update_only_target_fails_admission() -> None:
    manifest = demo_manifest(
        lambda d: d["actionSlots"][1]["associations"][0].update(mode="update_only")
    )
    active = resolve_active(manifest, INSTALL, "push-company")
    assert _company(active=active).reason is R.ASSOCIATION_TARGET_MISSING


def test_association_lookups_name_the_target_link_key() -> None:
    active = resolve_active(demo_manifest(), INSTALL, "push-company")
    keys = association_lookups(active, RecordView(exists=True, fields={"PrimaryContactId": "003A"}))
    assert keys == {
        "primary-contact": link_key(
            "demo-owner", "push-contact", "Contact", "003A", "remote-contacts"
        )
    }


# -- PATCH-1 ---------------------------------------------------------------------


def patch_reason(**overrides: Any) -> RejectReason:
    decision = decide_patch(contact_context(**({"link": contact_link()} | overrides)))
    assert isinstance(decision, Rejected), decision
    return decision.reason


def test_patch_without_finalized_link() -> None:
    assert patch_reason(link=None) is R.NO_FINALIZED_LINK


def test_patch_with_active_create_attempt() -> None:
    attempts = (AttemptSummary(attempt_id="a", status=AttemptStatus.WRITEBACK_PENDING),)
    assert patch_reason(attempts=attempts) is R.ACTIVE_ATTEMPT


def test_patch_with_fail_closed_drift() -> None:
    manifest = demo_manifest(lambda d: d["profiles"][0].update(credentialRef="env:OTHER_TOKEN"))
    decision = decide_patch(contact_context(link=contact_link(), active=contact_active(manifest)))
    assert isinstance(decision, Rejected) and decision.reason is R.DRIFT_FAIL_CLOSED
    assert [f.surface for f in decision.findings] == [DriftSurface.CREDENTIAL_REF]


@pytest.mark.parametrize(
    ("status", "expected"),
    [(LinkStatus.SUSPENDED_DRIFT, R.LINK_SUSPENDED), (LinkStatus.RETIRED, R.LINK_RETIRED)],
)
def test_patch_on_suspended_or_retired_link(status: LinkStatus, expected: R) -> None:
    assert patch_reason(link=contact_link(status)) is expected


def test_patch_with_failing_current_authority() -> None:
    no_email = PermissionFacts(
        object_readable=True, record_readable=True, readable_fields=CONTACT_FIELDS - {"Email"}
    )
    assert patch_reason(permissions=no_email) is R.FIELD_UNREADABLE


def test_patch_with_unrenderable_update_path() -> None:
    assert patch_reason(link=contact_link(remote_id="")) is R.UPDATE_PATH_UNRENDERABLE


def test_patch_with_benign_drift_proceeds_and_records_findings() -> None:
    manifest = demo_manifest(lambda d: d["actionSlots"][0].update(flowVersion="2"))
    decision = decide_patch(contact_context(link=contact_link(), active=contact_active(manifest)))
    assert isinstance(decision, PatchQueued)
    assert [f.surface for f in decision.findings] == [DriftSurface.FLOW_VERSION]
