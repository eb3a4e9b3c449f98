"""The drift matrix's "Active create attempt" column, end to end (SPEC C-5; seed 000 drift
rows D-18L, D-18A): a change to a frozen request surface has no effect on the attempt,
and an attempt whose remote id is already durable (`writeback_pending`) finishes its
mirror whatever drifted.
"""

from __future__ import annotations

import json

import pytest

from protocol.admission import CreateReserved
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from tests.e2e.attempt_drift_support import (
    CHANGES,
    COMPANIES,
    CONTACT,
    CONTACTS,
    DEALS,
    Edit,
    SeamHooks,
    applying,
)
from tests.e2e.attempt_drift_support import hooks as hooks  # the fixture
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.patch_support import Doc, apply_edit
from tests.e2e.support import eventually

# -- frozen request surfaces: the change has no effect on the attempt ---------------------


async def test_a_changed_create_path_never_reaches_the_wire(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks
) -> None:
    """D-15A (C-5; drift row "create path changes", attempt column frozen_no_effect):
    createPath changes between the reservation and the first POST (to the companies
    path) and again between the two tries (to the deals path). Both tries POST the frozen
    path: the remote's ledger shows two contact creates (the second a replay) and no
    company or deal."""

    def to_path(path: str) -> Edit:
        def edit(doc: Doc) -> None:
            doc["actionSlots"][CONTACT]["createPath"] = path

        return edit

    hooks.at_claim = [applying(stack, remote, to_path(COMPANIES))]
    hooks.at_answer = [applying(stack, remote, to_path(DEALS))]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="reset_after_effect", nth=1)
    )
    decision = await stack.push("c-001")
    assert isinstance(decision, CreateReserved), decision
    attempt = await eventually(
        lambda: stack.attempt(contact_key("c-001")), lambda r: r["status"] == "finalized"
    )
    assert hooks.tries == 2 and hooks.at_claim == [] and hooks.at_answer == []
    sent = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.replayed for e in sent] == [False, True]
    assert await stack.sandbox.ledger(object_type="companies") == []
    assert await stack.sandbox.ledger(object_type="deals") == []
    assert json.loads(attempt["request_snapshot"])["relative_path"] == CONTACTS
    findings = {f["surface"]: f["disposition"] for f in json.loads(attempt["drift_findings"])}
    assert findings["create_path"] == "frozen_no_effect"


async def test_a_changed_response_id_path_reads_the_id_with_the_frozen_one(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks
) -> None:
    """D-17A (C-5): responseIdPath changes (to the email property) between the
    reservation and the answer: the remote id is extracted with the frozen `$.id`."""

    def email_as_id(doc: Doc) -> None:
        doc["actionSlots"][CONTACT]["responseIdPath"] = "$.properties.email"

    hooks.at_claim = [applying(stack, remote, email_as_id)]
    await stack.push("c-001")
    attempt = await eventually(
        lambda: stack.attempt(contact_key("c-001")), lambda r: r["status"] == "finalized"
    )
    sent = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.object_id for e in sent] == [attempt["remote_id"]]
    assert "@" not in attempt["remote_id"]


# -- writeback_pending: the remote id is durable, the mirror finishes -------------------


def mirror_pair_changed(index: int) -> Edit:
    def edit(doc: Doc) -> None:
        doc["actionSlots"][index]["mirror"] = {
            "remoteIdField": "remote_id_v2__c",
            "provenanceField": "remote_provenance_v2__c",
        }

    return edit


WRITEBACK_CHANGES = {**CHANGES, "mirror-pair": mirror_pair_changed}  # + D-18L


async def record_fields(stack: Stack) -> dict[str, object]:
    text = await stack.pool.fetchval(
        "SELECT fields::text FROM crm_record "
        "WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    fields: dict[str, object] = json.loads(text)
    return fields


@pytest.mark.parametrize("change", sorted(WRITEBACK_CHANGES))
async def test_writeback_pending_finishes_its_mirror_whatever_changed(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks, change: str
) -> None:
    """D-08A, D-09A, D-10A, D-11A (writeback half), D-18L, D-18A (C-5: "writeback-only
    recovery can continue"). A foreign value in the mirror field holds c-001's attempt in
    writeback_pending (link finalized, remote id durable). The pack changes (destination
    slot, credentialRef, endpoint, base URL, generation, or the mirror pair itself); a
    save meanwhile sees the attempt, never a create (D-18A). Once the field is free the
    mirror is written to the frozen pair only (D-18L) and the remote saw one create."""
    key = contact_key("c-001")

    async def foreign_mirror() -> None:
        await stack.pool.execute(
            'UPDATE crm_record SET fields = fields || \'{"remote_id__c": "foreign-9"}\' '
            "WHERE source_object = 'Contact' AND record_id = 'c-001'"
        )

    hooks.at_claim = [foreign_mirror]
    await stack.push("c-001")
    pending = await eventually(
        lambda: stack.attempt(key), lambda r: r["status"] == "writeback_pending"
    )
    await apply_edit(stack.pool, remote, WRITEBACK_CHANGES[change](CONTACT))
    during = await stack.push("c-001")
    # D-18A: the attempt is seen. (A change that fails the link closed may refuse first.)
    assert during.kind != "create_reserved", during
    if change == "mirror-pair":
        assert during.kind == "observed_active_attempt", during
    await stack.pool.execute(
        "UPDATE crm_record SET fields = fields - 'remote_id__c' "
        "WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    attempt = await eventually(
        lambda: stack.attempt(key), lambda r: r["status"] == "finalized", timeout_s=60
    )
    assert attempt["attempt_id"] == pending["attempt_id"]
    assert attempt["mirror_status"] == "written"
    fields = await record_fields(stack)
    assert fields["remote_id__c"] == pending["remote_id"]
    assert fields["remote_provenance__c"] == key
    assert "remote_id_v2__c" not in fields and "remote_provenance_v2__c" not in fields
    after = await stack.push("c-001")  # D-18A: the link is seen (PATCH or a refusal)
    assert after.kind != "create_reserved", after
    attempts = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_push_attempt WHERE link_key = $1", key
    )
    assert attempts == 1
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.object_id for e in creates] == [pending["remote_id"]]


async def test_a_create_answered_after_its_slot_was_removed_is_born_suspended(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks
) -> None:
    """C-9, G-4: the contact slot is recreated under a new id (no lineage) while the POST
    is in flight (between its answer and its application). The object exists at the remote,
    so the link records it, but it is born suspended (`drift:action_recreated`), as the
    apply suspended the links it found: never finalized under a slot the active pack lacks.
    Found by the chaos campaign's side paths; fails without services.mirror's check."""

    def recreated(doc: Doc) -> None:
        doc["actionSlots"][CONTACT]["id"] = "push-contact-v2"
        for slot in doc["actionSlots"]:
            for association in slot.get("associations", []):
                if association["targetActionSlot"] == "push-contact":
                    association["targetActionSlot"] = "push-contact-v2"
        doc["lineage"] = []

    hooks.at_answer = [applying(stack, remote, recreated)]
    decision = await stack.push("c-001")
    assert isinstance(decision, CreateReserved), decision
    key = contact_key("c-001")
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    link = await stack.link(key)
    assert link is not None and link["remote_id"] == attempt["remote_id"]
    assert link["status"] == "suspended_drift"
    assert link["suspend_reason"] == "drift:action_recreated"
    assert len(await stack.sandbox.ledger(object_type="contacts", kind="create")) == 1
