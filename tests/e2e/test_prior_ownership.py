"""Issue 15's two live defects, end to end on the demo pack and the sandbox remote.

Defect 1 (GATE-1, ID-6; seed "Stable Slot Identity", drift row "Flow action
removed/recreated with new or missing ActionSlotId"): a slot renamed without
lineage must not reserve a fresh create for a record that already owns a remote
object at that destination. Defect 2 (GATE-2; drift matrix column "Active create
attempt"): a reserved create whose profile's credential changed never POSTs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from protocol.admission import DeferredAssociationReserved, PatchQueued, Rejected
from protocol.errors import RejectReason
from protocol.identity import link_key
from protocol.messages import RetireInput
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.backfill import apply_backfill
from services.wake import wake_link
from tests.e2e.conftest import OWNER, Stack, company_key, contact_key
from tests.e2e.patch_support import Doc, apply_edit
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow


def rename_contact_slot(doc: Doc) -> None:
    """`push-contact` becomes `push-contact-new`, with no lineage entry for it."""
    doc["actionSlots"][0]["id"] = "push-contact-new"
    doc["actionSlots"][1]["associations"][0]["targetActionSlot"] = "push-contact-new"
    doc["lineage"] = []


def rename_company_slot(doc: Doc) -> None:
    doc["actionSlots"][1]["id"] = "push-company-new"


async def finalize(stack: Stack, record_id: str, **where: str) -> str:
    """Push a record and wait for its create to finalize (mirror written); its remote id."""
    await stack.push(record_id, **where)
    key = link_key(OWNER, where["slot"], where["obj"], record_id, where["dest"])
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    assert attempt["mirror_status"] == "written"
    remote_id: str = attempt["remote_id"]
    return remote_id


CONTACT = {"slot": "push-contact", "obj": "Contact", "dest": "remote-contacts"}
COMPANY = {"slot": "push-company", "obj": "Account", "dest": "remote-companies"}


@pytest.mark.parametrize(
    ("record_id", "where", "rename", "new_slot", "object_type"),
    [
        pytest.param("c-002", CONTACT, rename_contact_slot, "push-contact-new", "contacts",
                     id="contact-slot-renamed"),
        pytest.param("a-002", COMPANY, rename_company_slot, "push-company-new", "companies",
                     id="account-slot-renamed"),
    ],
)  # fmt: skip
async def test_a_renamed_slot_without_lineage_refuses_instead_of_creating_again(
    stack: Stack,
    remote: BackgroundSandbox,
    record_id: str,
    where: dict[str, str],
    rename: Callable[[Doc], None],
    new_slot: str,
    object_type: str,
) -> None:
    if record_id == "a-002":
        await finalize(stack, "c-002", **CONTACT)  # its primary contact: no deferred lane
    remote_id = await finalize(stack, record_id, **where)
    old_key = link_key(OWNER, where["slot"], where["obj"], record_id, where["dest"])
    await apply_edit(stack.pool, remote, rename)
    decision = await stack.push(record_id, **{**where, "slot": new_slot})
    assert isinstance(decision, Rejected), decision
    assert decision.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN
    # It names what it found: the old link (under its key and slot) and the mirror values.
    assert old_key in decision.detail and remote_id in decision.detail
    assert f"'{where['slot']}'" in decision.detail
    new_key = link_key(OWNER, new_slot, where["obj"], record_id, where["dest"])
    attempts = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_push_attempt WHERE link_key = $1", new_key
    )
    assert attempts == 0
    creates = await stack.sandbox.ledger(object_type=object_type, kind="create")
    assert [e.object_id for e in creates] == [remote_id]


async def retire(stack: Stack, key: str) -> None:
    """The operator's `retire` (a LinkWorkflow update, as the CLI sends it)."""
    await wake_link(stack.client, stack.task_queue, key, None, for_operator=True)
    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.loaded)
    request = RetireInput(operator="ops@example.com", reason="slot renamed without lineage")
    await handle.execute_update(LinkWorkflow.retire, request, id=f"retire/{key}")
    link = await stack.link(key)
    assert link is not None and link["status"] == "retired"


async def test_a_retired_old_link_is_the_operator_way_out(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """Retiring the old link resolves the uncertainty (docs/packs.md: "retire the old link"):
    the renamed slot may then reserve its own create."""
    await finalize(stack, "c-002", **CONTACT)
    await apply_edit(stack.pool, remote, rename_contact_slot)
    await retire(stack, contact_key("c-002"))
    decision = await stack.push("c-002", **{**CONTACT, "slot": "push-contact-new"})
    assert decision.kind == "create_reserved", decision


def rename_contact_slot_with_lineage(doc: Doc) -> None:
    rename_contact_slot(doc)
    doc["lineage"] = [{"kind": "rebind", "fromSlot": "push-contact", "toSlot": "push-contact-new"}]


async def test_declared_lineage_retire_and_backfill_keep_the_one_remote_object(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """docs/packs.md's way to keep the remote object: declare the rebind (still refused: the
    live old link's mirror is not explained by a declaration), retire the old link (a save
    is still refused), `backfill apply` adopts its remote id under the new slot; the next
    save PATCHes."""
    remote_id = await finalize(stack, "c-002", **CONTACT)
    await apply_edit(stack.pool, remote, rename_contact_slot_with_lineage)
    moved = {**CONTACT, "slot": "push-contact-new"}
    refusal = await stack.push("c-002", **moved)
    assert isinstance(refusal, Rejected), refusal
    assert refusal.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN
    await retire(stack, contact_key("c-002"))
    # Between the retire and the backfill a save still refuses: the retired link under the
    # rebound slot does not explain the mirror (the rebind was declared to keep its object).
    between = await stack.push("c-002", **moved)
    assert isinstance(between, Rejected), between
    assert between.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN and remote_id in between.detail
    async with stack.pool.acquire() as conn:
        report = await apply_backfill(conn, OWNER, ["push-contact-new"], now=datetime.now(UTC))
    assert report.totals.adopted == 1, [(d.reason, d.detail) for d in report.decisions]
    decision = await stack.push("c-002", **moved)
    assert isinstance(decision, PatchQueued) and decision.remote_id == remote_id
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.object_id for e in creates] == [remote_id]


def change_company_credential(doc: Doc) -> None:
    profile: Doc = doc["profiles"][1]
    assert profile["name"] == "sandbox-plain"
    profile["credentialRef"] = "env:OTHER_TOKEN"
    profile["credentialGeneration"] = "2"


async def test_a_deferred_create_never_posts_after_its_credential_changed(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """Defect 2: a-001 waits for c-001 (deferred lane); the companies profile's credential
    ref and generation change; c-001 finalizes and wakes a-001, which parks
    `terminal_failed` with the findings before any POST."""
    decision = await stack.push("a-001", **COMPANY)
    assert isinstance(decision, DeferredAssociationReserved)
    await apply_edit(stack.pool, remote, change_company_credential)
    await finalize(stack, "c-001", **CONTACT)
    key = company_key("a-001")
    attempt = await eventually(
        lambda: stack.attempt(key), lambda r: r["status"] == "terminal_failed", timeout_s=60
    )
    assert attempt["remote_io_started_at"] is None
    assert "credential_ref" in attempt["last_error"]
    findings = json.loads(attempt["drift_findings"])
    assert {"credential_ref", "fail_closed"} <= {v for f in findings for v in f.values()}
    assert await stack.sandbox.ledger(object_type="companies", kind="create") == []
    journal = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_send_journal WHERE attempt_id = $1",
        attempt["attempt_id"],
    )
    assert journal == 0
    view = await eventually(
        lambda: stack.handle(key).query(LinkWorkflow.state), lambda v: v.needs_operator
    )
    assert view.attempt_status == "terminal_failed"


async def test_a_benign_drift_is_recorded_and_the_create_proceeds(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """GATE-2's other half: a frozen-no-effect finding (a Flow version bump) is recorded
    on the attempt and the frozen request is sent."""
    decision = await stack.push("a-001", **COMPANY)
    assert isinstance(decision, DeferredAssociationReserved)

    def flow_version(doc: Doc) -> None:
        doc["actionSlots"][1]["flowVersion"] = "2"

    await apply_edit(stack.pool, remote, flow_version)
    await finalize(stack, "c-001", **CONTACT)
    attempt = await eventually(
        lambda: stack.attempt(company_key("a-001")), lambda r: r["status"] == "finalized"
    )
    surfaces = {f["surface"]: f["disposition"] for f in json.loads(attempt["drift_findings"])}
    assert surfaces["flow_version"] == "frozen_no_effect"
    assert len(await stack.sandbox.ledger(object_type="companies", kind="create")) == 1


def move_company_slot_to_a_new_destination(doc: Doc) -> None:
    """`push-company` now names `remote-companies-v2`: the companies destination recreated
    with a new DestinationSlotId (same target object, same scope)."""
    old = next(d for d in doc["destinationSlots"] if d["id"] == "remote-companies")
    doc["destinationSlots"].append({**old, "id": "remote-companies-v2"})
    doc["actionSlots"][1]["destinationSlot"] = "remote-companies-v2"


async def test_a_recreated_destination_slot_refuses_while_the_old_create_may_have_landed(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """Seed drift rows "connector profile ... recreated with new DestinationSlotId" and
    "target object changes with new/missing DestinationSlotId" (GATE-1): the old create may
    have landed and wrote no mirror, so the new key finds no rows and no mirror evidence.
    It must fail closed, not POST a second company; retiring the old row is the way out."""
    await finalize(stack, "c-002", **CONTACT)  # the company's primary contact: no deferred lane
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/companies", action="reset_after_effect")
    )
    await stack.push("a-002", **COMPANY)
    old_key = company_key("a-002")
    await eventually(
        lambda: stack.attempt(old_key), lambda r: r["status"] == "ambiguous_remote_effect"
    )
    await stack.sandbox.clear_faults()
    await apply_edit(stack.pool, remote, move_company_slot_to_a_new_destination)
    moved = {**COMPANY, "dest": "remote-companies-v2"}
    decision = await stack.push("a-002", **moved)
    assert isinstance(decision, Rejected), decision
    assert decision.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN
    assert old_key in decision.detail and "'remote-companies'" in decision.detail
    new_key = link_key(OWNER, "push-company", "Account", "a-002", "remote-companies-v2")
    attempts = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_push_attempt WHERE link_key = $1", new_key
    )
    assert attempts == 0
    assert len(await stack.sandbox.ledger(object_type="companies", kind="create")) == 1


# -- C-6: rows under a slot the active pack no longer has ------------------------------


def recreate_deal_pair(doc: Doc) -> None:
    """`push-deal`/`remote-deals` become `push-deal-v2`/`remote-deals-v2` (same target
    object and scope), with a new mirror field pair and no lineage entry for them."""
    slot: Doc = doc["actionSlots"][2]
    assert slot["id"] == "push-deal"
    slot["id"], slot["destinationSlot"] = "push-deal-v2", "remote-deals-v2"
    slot["mirror"] = {"remoteIdField": "deal_id_v2__c", "provenanceField": "deal_prov_v2__c"}
    destination: Doc = doc["destinationSlots"][2]
    assert destination["id"] == "remote-deals"
    destination["id"] = "remote-deals-v2"


def recreate_company_pair(doc: Doc) -> None:
    """As `recreate_deal_pair`, for `push-company`/`remote-companies`."""
    slot: Doc = doc["actionSlots"][1]
    assert slot["id"] == "push-company"
    slot["id"], slot["destinationSlot"] = "push-company-v2", "remote-companies-v2"
    slot["mirror"] = {"remoteIdField": "co_id_v2__c", "provenanceField": "co_prov_v2__c"}
    destination: Doc = doc["destinationSlots"][1]
    assert destination["id"] == "remote-companies"
    destination["id"] = "remote-companies-v2"


async def new_pair_attempts(stack: Stack, key: str) -> int:
    count: int = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_push_attempt WHERE link_key = $1", key
    )
    return count


async def test_both_slots_recreated_refuses_while_the_old_link_is_finalized(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """SPEC C-6 (issue 30 item 5; seed 000 "Link Key": never reserve a fresh create merely
    because a recomputed key found no rows). Deal o-001 finalized under
    push-deal/remote-deals; a pack recreates BOTH slots under new ids with a new mirror
    pair and no lineage, so the new key, the new mirror pair and the old slots' rules all
    find nothing. The save under the new ids must be refused `prior_ownership_uncertain`
    (before C-6 it was `create_reserved` and a second deal was created): no attempt, one
    create in the ledger; retiring the old link is the way out."""
    where = {"slot": "push-deal", "obj": "Opportunity", "dest": "remote-deals"}
    remote_id = await finalize(stack, "o-001", **where)
    await apply_edit(stack.pool, remote, recreate_deal_pair)
    moved = {**where, "slot": "push-deal-v2", "dest": "remote-deals-v2"}
    decision = await stack.push("o-001", **moved)
    assert isinstance(decision, Rejected), decision
    assert decision.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN
    old_key = link_key(OWNER, "push-deal", "Opportunity", "o-001", "remote-deals")
    assert old_key in decision.detail and remote_id in decision.detail
    new_key = link_key(OWNER, "push-deal-v2", "Opportunity", "o-001", "remote-deals-v2")
    assert await new_pair_attempts(stack, new_key) == 0
    creates = await stack.sandbox.ledger(object_type="deals", kind="create")
    assert [e.object_id for e in creates] == [remote_id]
    await retire(stack, old_key)
    after = await stack.push("o-001", **moved)
    assert after.kind == "create_reserved", after


async def test_both_slots_recreated_refuses_while_the_old_create_is_ambiguous(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """Seed row P-08 (000:98-103, 414, 468-469; SPEC C-6): a-002's create lands but its
    answer is lost (plain profile: `ambiguous_remote_effect`, no mirror written); the pack
    recreates both the company action slot and its destination slot under new ids (same
    target object and scope, no lineage). The save under the new pair is rejected
    `prior_ownership_uncertain` with zero new attempts, and the ledger holds one create."""
    await finalize(stack, "c-002", **CONTACT)  # the company's primary contact: no deferred lane
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/companies", action="reset_after_effect")
    )
    await stack.push("a-002", **COMPANY)
    old_key = company_key("a-002")
    await eventually(
        lambda: stack.attempt(old_key), lambda r: r["status"] == "ambiguous_remote_effect"
    )
    await stack.sandbox.clear_faults()
    await apply_edit(stack.pool, remote, recreate_company_pair)
    moved = {**COMPANY, "slot": "push-company-v2", "dest": "remote-companies-v2"}
    decision = await stack.push("a-002", **moved)
    assert isinstance(decision, Rejected), decision
    assert decision.reason is RejectReason.PRIOR_OWNERSHIP_UNCERTAIN
    assert old_key in decision.detail and "ambiguous_remote_effect" in decision.detail
    new_key = link_key(OWNER, "push-company-v2", "Account", "a-002", "remote-companies-v2")
    assert await new_pair_attempts(stack, new_key) == 0
    assert len(await stack.sandbox.ledger(object_type="companies", kind="create")) == 1
