"""Park reasons, remedies, update templates and lenient update input (SPEC OPS-1, WF-3)."""

from __future__ import annotations

import json

import pytest

from protocol.messages import LinkView, ReconcileInput, SupersedeInput
from protocol.operator import OperatorAction
from protocol.park import (
    REMEDIES,
    UPDATE_INPUTS,
    ParkReason,
    park_reason,
    remedy_for,
    suspended_reason,
    update_template,
)
from protocol.states import AttemptStatus, LinkStatus, PatchStatus
from protocol.summary import LinkFacts, link_summary
from protocol.update_input import UpdateInputError, parse_update_input
from workflows.details import details_markdown

KEY = "lk1_" + "a" * 64


def view(**fields: object) -> LinkView:
    return LinkView.model_validate({"link_key": KEY, **fields})


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"attempt_status": "ambiguous_remote_effect"}, ParkReason.AMBIGUOUS_REMOTE_EFFECT),
        ({"attempt_status": "terminal_failed"}, ParkReason.TERMINAL_FAILED),
        ({"link_status": "suspended_drift", "suspend_reason": "drift"}, ParkReason.DRIFT),
        ({"link_status": "suspended_drift", "suspend_reason": "drift:endpoint"}, ParkReason.DRIFT),
        (
            {"link_status": "suspended_drift", "suspend_reason": "remote_deleted"},
            ParkReason.REMOTE_DELETED,
        ),
        (
            {"link_status": "suspended_drift", "suspend_reason": "remote_conflict"},
            ParkReason.REMOTE_CONFLICT,
        ),
        (
            {"link_status": "finalized", "last_patch_status": "ambiguous_remote_effect"},
            ParkReason.PATCH_OUTCOME_UNKNOWN,
        ),
        ({"link_status": "finalized", "attempt_status": "finalized"}, None),
        ({"attempt_status": "pending"}, None),
        ({}, None),
    ],
)
def test_park_reason_of_each_state(fields: dict[str, object], reason: ParkReason | None) -> None:
    assert park_reason(view(**fields)) is reason


def test_a_queued_patch_will_converge_an_unknown_outcome() -> None:
    queued = view(
        link_status=LinkStatus.FINALIZED,
        last_patch_status=PatchStatus.AMBIGUOUS_REMOTE_EFFECT,
        pending_patches=[PatchStatus.PENDING],
    )
    assert park_reason(queued) is None


def test_an_unknown_suspend_reason_fails_closed_as_drift() -> None:
    assert suspended_reason(None) is ParkReason.DRIFT
    assert suspended_reason("something_new") is ParkReason.DRIFT


def test_every_reason_has_a_remedy_naming_its_update() -> None:
    assert set(REMEDIES) == set(ParkReason)
    assert REMEDIES[ParkReason.AMBIGUOUS_REMOTE_EFFECT].update is OperatorAction.RECONCILE
    assert REMEDIES[ParkReason.TERMINAL_FAILED].update is OperatorAction.SUPERSEDE
    assert REMEDIES[ParkReason.REMOTE_DELETED].update is OperatorAction.RETIRE
    drift = REMEDIES[ParkReason.DRIFT]
    assert (drift.update, drift.alternatives) == (
        OperatorAction.REVALIDATE,
        (OperatorAction.RETIRE,),
    )


@pytest.mark.parametrize("action", list(OperatorAction))
def test_each_template_filled_in_is_the_updates_input(action: OperatorAction) -> None:
    template = update_template(action)
    filled = {k: ("x" if isinstance(v, str) else v) for k, v in template.items()}
    parsed = parse_update_input(UPDATE_INPUTS[action], filled, template)
    assert parsed.operator == "x"
    assert "idempotency_key" not in template  # filled in by the handler


def test_input_is_decoded_leniently_and_every_bad_field_named() -> None:
    example = update_template(OperatorAction.RECONCILE)
    good = {"operator": "o", "reason": "r", "remote_id": "1", "evidence": "e"}
    assert parse_update_input(ReconcileInput, good, example).remote_id == "1"
    assert parse_update_input(ReconcileInput, json.dumps(good), example).evidence == "e"
    typed = ReconcileInput.model_validate(good)
    assert parse_update_input(ReconcileInput, typed, example) is typed
    with pytest.raises(UpdateInputError) as missing:
        parse_update_input(ReconcileInput, {"operator": "o", "remote_id": "", "x": 1}, example)
    message = str(missing.value)
    assert "missing field 'reason'" in message and "missing field 'evidence'" in message
    assert "field 'remote_id': String should have at least 1 character" in message
    assert "unknown field 'x'" in message
    assert '"remote_id": "<remote_id>"' in message  # the template, to copy
    for junk in (None, 7, "not json", ["a"]):
        with pytest.raises(UpdateInputError, match="expected a JSON object"):
            parse_update_input(ReconcileInput, junk, example)


def test_supersede_keeps_its_default() -> None:
    parsed = parse_update_input(
        SupersedeInput, {"operator": "o", "reason": "r"}, update_template(OperatorAction.SUPERSEDE)
    )
    assert parsed.reserve_next is True


def test_details_give_the_remedy_and_the_json_to_paste() -> None:
    parked = view(attempt_status=AttemptStatus.AMBIGUOUS_REMOTE_EFFECT, last_error="reset")
    text = details_markdown(parked, ParkReason.AMBIGUOUS_REMOTE_EFFECT)
    assert "**needs operator: `ambiguous_remote_effect`** (reset)" in text
    assert "Send an Update → pick `reconcile`" in text
    assert json.dumps(update_template(OperatorAction.RECONCILE), indent=2) in text
    assert "Send an Update" not in details_markdown(view(link_status="finalized"), None)


def test_summary_names_record_destination_and_action() -> None:
    facts = LinkFacts(
        link_key=KEY,
        connector_owner_key="demo-owner",
        action_slot_id="push-company",
        destination_slot_id="remote-companies",
        source_object="Account",
        source_record_id="a-001",
    )
    assert link_summary(facts, KEY) == (
        "Account a-001 → remote-companies via push-company (demo-owner)"
    )
    assert link_summary(None, KEY) == f"link {KEY}"


def test_a_link_whose_action_slot_is_gone_is_never_told_to_revalidate() -> None:
    """C-9, issue 30: a link suspended because the active pack lost its action slot cannot
    be revalidated (the slot does not resolve), so neither the UI details nor `links show`
    offer revalidate; other drift still does."""
    gone = remedy_for(ParkReason.DRIFT, "drift:action_recreated")
    assert OperatorAction.REVALIDATE not in (gone.update, *gone.alternatives)
    assert gone.update is OperatorAction.RETIRE
    assert "rebind" in gone.what
    assert remedy_for(ParkReason.DRIFT, "drift:endpoint") is REMEDIES[ParkReason.DRIFT]
    assert remedy_for(ParkReason.DRIFT, None) is REMEDIES[ParkReason.DRIFT]
