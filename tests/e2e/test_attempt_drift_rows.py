"""The drift matrix's "Active create attempt" column, end to end (SPEC C-5, GATE-2; seed 000
drift rows 416-429): the attempt-side drift check runs before every re-send of a create
(a retry, and the re-send after a locator lookup that found nothing); a fail-closed
finding parks the attempt with nothing sent, and a generation rotation declared on both
sides re-sends the frozen request (D-11A). (Frozen-request surfaces and
`writeback_pending` are in test_attempt_drift_frozen.py.)

Changes are applied at the create path's test seams: after a try's answer (between two
tries) or after the claim (between the reservation and the POST). Seed rows D-05A,
D-08A, D-09A, D-10A, D-11A, D-15A, D-17A.
"""

from __future__ import annotations

import json

import pytest

from db import packs as packs_q
from protocol.admission import CreateReserved
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack, get_active_pack
from tests.e2e.attempt_drift_support import (
    CHANGES,
    COMPANIES,
    COMPANY,
    CONTACT,
    CONTACTS,
    DEAL,
    DEALS,
    SURFACE,
    SeamHooks,
    Step,
    applying,
    assert_parked_for,
    journal_rows,
    parked,
    slot_profile,
)
from tests.e2e.attempt_drift_support import hooks as hooks  # the fixture
from tests.e2e.conftest import OWNER, Stack, company_key, contact_key, deal_key, demo_manifest
from tests.e2e.patch_support import Doc, apply_edit
from tests.e2e.support import eventually

# -- a re-send after a change: parked, nothing sent ------------------------------------


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_a_replay_safe_resend_after_a_change_parks_unsent(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks, change: str
) -> None:
    """D-08A, D-09A, D-10A, D-11A (replay-safe half; C-5): c-001's first POST lands and
    its answer is lost (the contacts profile de-duplicates by Idempotency-Key, so the
    same request may be re-sent). Before the re-send the destination slot is removed, or
    the credentialRef, endpoint class, base URL or credential generation (no rotation
    declared) changes: the attempt parks `ambiguous_remote_effect` and sends nothing
    more; the remote saw one create, no replay."""
    hooks.at_answer = [applying(stack, remote, CHANGES[change](CONTACT))]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="reset_after_effect", nth=1)
    )
    decision = await stack.push("c-001")
    assert isinstance(decision, CreateReserved), decision
    attempt = await parked(stack, contact_key("c-001"))
    assert_parked_for(attempt, SURFACE[change])
    sent = await stack.sandbox.ledger(object_type="contacts")
    assert [(e.kind, e.replayed) for e in sent] == [("create", False)]
    assert await journal_rows(stack, attempt["attempt_id"]) == 1
    assert hooks.tries == 1 and hooks.at_answer == []


async def remove_owner_pack(stack: Stack) -> None:
    """The owner's pack is removed: no install of `demo-owner` is active any more."""
    async with stack.pool.acquire() as conn:
        pack = await get_active_pack(conn, OWNER)
        assert pack is not None
        assert await packs_q.deactivate_install(conn, pack.pack_install_id)


async def change_owner_key(stack: Stack, remote: BackgroundSandbox) -> None:
    """The pack now belongs to another owner key: `demo-owner` has no active install."""
    doc = demo_manifest(remote.url)
    doc["connectorOwnerKey"] = "demo-owner-2"
    async with stack.pool.acquire() as conn:
        await apply_pack(conn, doc)
    await remove_owner_pack(stack)


LOCATOR_CHANGES = [*sorted(CHANGES), "pack-removed", "owner-key-changed"]


@pytest.mark.parametrize("change", LOCATOR_CHANGES)
async def test_a_locator_resend_after_a_change_parks_unsent(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks, change: str
) -> None:
    """C-5's reproduction and D-05A, D-08A, D-09A, D-10A, D-11A (locator half): o-001's
    first POST is reset before it had any effect (the deals profile recovers by a unique
    locator). Meanwhile the owner's pack is removed, or its owner key changes, or the
    destination slot is removed, or the profile's credentialRef, endpoint class, base
    URL or generation changes. The lookup that would follow is a request like any other
    (G-1): each change moves where it goes or who sends it, so the gate refuses it and
    the re-send after it: the attempt parks `ambiguous_remote_effect`, nothing more is
    sent, and the ledger holds no create. (Before C-5 the re-send was not gated: the
    deal was POSTed under the changed pack and finalized; before G-1 the lookup went.)"""
    if change == "pack-removed":
        step: Step = lambda: remove_owner_pack(stack)  # noqa: E731
    elif change == "owner-key-changed":
        step = lambda: change_owner_key(stack, remote)  # noqa: E731
    else:
        step = applying(stack, remote, CHANGES[change](DEAL))
    hooks.at_answer = [step]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=DEALS, action="reset_before_effect", nth=1)
    )
    decision = await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    assert isinstance(decision, CreateReserved), decision
    attempt = await parked(stack, deal_key("o-001"))
    surface = {"pack-removed": "owner_identity", "owner-key-changed": "owner_identity"}
    assert_parked_for(attempt, surface.get(change) or SURFACE[change], "locator lookup")
    assert await stack.sandbox.ledger(object_type="deals", kind="create") == []
    assert await journal_rows(stack, attempt["attempt_id"]) == 1  # the POST; no lookup
    assert attempt["remote_id"] is None


# -- D-11A: generation alone ------------------------------------------------------------


def declare_rotation(doc: Doc) -> None:
    slot_profile(doc, CONTACT)["credentialRotationSameDestination"] = True


def rotate_generation(doc: Doc) -> None:
    declare_rotation(doc)
    slot_profile(doc, CONTACT)["credentialGeneration"] = "2"


async def test_a_generation_rotation_declared_on_both_sides_resends_the_frozen_request(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks
) -> None:
    """D-11A (replay-safe half; C-5): the contacts profile declares that a credential
    rotation keeps the destination, before the reservation (frozen) and after (active).
    The first POST lands, its answer is lost, the generation alone changes: the finding
    is frozen_no_effect and the same request is re-sent (a replay), then finalized."""
    await apply_edit(stack.pool, remote, declare_rotation)
    hooks.at_answer = [applying(stack, remote, rotate_generation)]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="reset_after_effect", nth=1)
    )
    decision = await stack.push("c-001")
    assert isinstance(decision, CreateReserved), decision
    attempt = await eventually(
        lambda: stack.attempt(contact_key("c-001")), lambda r: r["status"] == "finalized"
    )
    findings = {f["surface"]: f["disposition"] for f in json.loads(attempt["drift_findings"])}
    assert findings["credential_generation"] == "frozen_no_effect"
    sent = await stack.sandbox.ledger(object_type="contacts")
    assert [e.replayed for e in sent] == [False, True]
    assert {e.object_id for e in sent} == {attempt["remote_id"]}


def plain_generation(doc: Doc) -> None:
    slot_profile(doc, COMPANY)["credentialGeneration"] = "2"


async def test_a_generation_change_parks_a_plain_profiles_resend(
    stack: Stack, remote: BackgroundSandbox, hooks: SeamHooks
) -> None:
    """D-11A (plain half; C-5): a-002's first POST is answered 429, which the plain
    companies profile declares "not applied", so the same request would be sent again.
    The generation alone changes before that re-send: parked, nothing more sent."""
    await stack.push("c-002")  # the company's primary contact: no deferred lane
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )
    hooks.tries = 0
    hooks.at_answer = [applying(stack, remote, plain_generation)]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="status", status=429, nth=1)
    )
    decision = await stack.push(
        "a-002", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, CreateReserved), decision
    key = company_key("a-002")
    attempt = await eventually(
        lambda: stack.attempt(key),
        lambda r: r["status"] in {"ambiguous_remote_effect", "terminal_failed"},
        timeout_s=60,
    )
    assert_parked_for(attempt, "credential_generation")
    assert await stack.sandbox.ledger(object_type="companies", kind="create") == []
    assert hooks.tries == 1
