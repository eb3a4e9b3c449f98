"""The drift matrix's "Active create attempt" column, end to end (SPEC C-5, GATE-2; seed 000
drift rows 416-429): the attempt-side drift check runs before every send of a create
(the first try, every retry, and the re-send after a locator lookup that found
nothing); a fail-closed finding parks the attempt with nothing sent, a frozen-no-effect
one sends the frozen request, and an attempt whose remote id is already durable
(`writeback_pending`) finishes its mirror whatever drifted.

Changes are applied at the create path's test seams: after a try's answer (between two
tries) or after the claim (between the reservation and the POST). Seed rows D-05A,
D-08A, D-09A, D-10A, D-11A, D-15A, D-17A, D-18L, D-18A.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from activities.hooks import DispatchHooks
from db import packs as packs_q
from protocol.admission import CreateReserved
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack, get_active_pack
from tests.e2e.conftest import OWNER, Stack, company_key, contact_key, deal_key, demo_manifest
from tests.e2e.patch_support import Doc, apply_edit
from tests.e2e.support import eventually

Step = Callable[[], Awaitable[None]]
Edit = Callable[[Doc], None]

CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"
DEALS = "/crm/v3/objects/deals"
CONTACT, COMPANY, DEAL = 0, 1, 2  # index of the action and destination slot in the demo pack


class SeamHooks(DispatchHooks):
    """Runs the next queued step at each try's claim (before its POST) and at each answer
    (before it is applied: the next send is the one after the change)."""

    def __init__(self) -> None:
        self.at_claim: list[Step] = []
        self.at_answer: list[Step] = []
        self.tries = 0

    async def before_checkpoint(self, attempt_id: str) -> None:
        del attempt_id
        self.tries += 1
        if self.at_claim:
            await self.at_claim.pop(0)()

    async def after_answer(self, attempt_id: str) -> None:
        del attempt_id
        if self.at_answer:
            await self.at_answer.pop(0)()


@pytest.fixture
def hooks() -> SeamHooks:
    return SeamHooks()


# -- pack edits, by slot index ---------------------------------------------------------


def _profile(doc: Doc, index: int) -> Doc:
    name = doc["destinationSlots"][index]["profile"]
    profile: Doc = next(p for p in doc["profiles"] if p["name"] == name)
    return profile


def destination_removed(index: int) -> Edit:
    """The slot's destination slot is gone; the action slot names a new one (same target)."""

    def edit(doc: Doc) -> None:
        destination = doc["destinationSlots"][index]
        destination["id"] = f"{destination['id']}-v2"
        doc["actionSlots"][index]["destinationSlot"] = destination["id"]

    return edit


def profile_edit(**values: str) -> Callable[[int], Edit]:
    def for_slot(index: int) -> Edit:
        def edit(doc: Doc) -> None:
            _profile(doc, index).update(values)

        return edit

    return for_slot


CHANGES = {
    "destination-removed": destination_removed,  # D-08A
    "credential-ref": profile_edit(credentialRef="env:OTHER_TOKEN"),  # D-09A
    "endpoint-class": profile_edit(endpointClass="objects-api-v2"),  # D-10A
    "base-url": profile_edit(baseUrl="http://127.0.0.1:9"),  # D-10A
    "generation": profile_edit(credentialGeneration="2"),  # D-11A, no rotation declared
}
SURFACE = {
    "destination-removed": "profile_replaced",
    "credential-ref": "credential_ref",
    "endpoint-class": "endpoint",
    "base-url": "endpoint",
    "generation": "credential_generation",
}


def applying(stack: Stack, remote: BackgroundSandbox, edit: Edit) -> Step:
    async def step() -> None:
        await apply_edit(stack.pool, remote, edit)

    return step


async def journal_rows(stack: Stack, attempt_id: object) -> int:
    count: int = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_send_journal WHERE attempt_id = $1", attempt_id
    )
    return count


async def parked(stack: Stack, key: str) -> asyncpg.Record:
    return await eventually(
        lambda: stack.attempt(key), lambda r: r["status"] == "ambiguous_remote_effect"
    )


def assert_parked_for(attempt: asyncpg.Record, surface: str) -> None:
    assert "drift before POST" in attempt["last_error"], attempt["last_error"]
    findings = json.loads(attempt["drift_findings"])
    assert {"surface": surface, "disposition": "fail_closed"}.items() <= {
        k: v for f in findings if f["surface"] == surface for k, v in f.items()
    }.items(), findings


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
    URL or generation changes. The lookup finds nothing, and the re-send that would
    follow is gated like any send: the attempt parks `ambiguous_remote_effect` and the
    ledger holds no create. (Before C-5 the re-send was not gated: the deal was POSTed
    under the changed pack and finalized.)"""
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
    assert_parked_for(attempt, surface.get(change) or SURFACE[change])
    assert await stack.sandbox.ledger(object_type="deals", kind="create") == []
    assert await journal_rows(stack, attempt["attempt_id"]) == 1
    assert attempt["remote_id"] is None


# -- D-11A: generation alone ------------------------------------------------------------


def declare_rotation(doc: Doc) -> None:
    _profile(doc, CONTACT)["credentialRotationSameDestination"] = True


def rotate_generation(doc: Doc) -> None:
    declare_rotation(doc)
    _profile(doc, CONTACT)["credentialGeneration"] = "2"


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
    _profile(doc, COMPANY)["credentialGeneration"] = "2"


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
