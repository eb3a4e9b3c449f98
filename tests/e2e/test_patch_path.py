"""The PATCH path through the workflow (SPEC PATCH-1..3, PROF-2): one PATCH per save,
coalescing, the remote's 404/409, revoked fields, ambiguity, and the entity-tag
precondition. (Drift and revalidate are in test_patch_drift.py.)"""

from __future__ import annotations

import json

import asyncpg
import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from protocol.admission import PatchQueued, Rejected
from protocol.errors import RejectReason
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack, company_key, deal_key
from tests.e2e.patch_support import (
    finalized_contact,
    patch_rows,
    patches,
    remote_object,
    set_field,
    settled,
    suspended,
)
from tests.e2e.support import eventually


async def test_save_after_finalize_patches_once_with_readable_fields(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    link = await finalized_contact(stack)
    await set_field(stack.pool, "Contact", "c-001", "FirstName", "Augusta")
    decision = await stack.push("c-001", user="bob")  # bob cannot read Phone
    assert isinstance(decision, PatchQueued)
    rows = await settled(stack, link["link_key"])
    assert [r["status"] for r in rows] == ["succeeded"]
    assert len(await patches(stack)) == 1
    body = json.loads(rows[0]["body"])
    assert body["properties"]["firstname"] == "Augusta" and "phone" not in body["properties"]
    obj = await remote_object(remote, "contacts", link["remote_id"])
    assert obj["properties"]["firstname"] == "Augusta"
    assert len(await stack.sandbox.ledger(object_type="contacts", kind="create")) == 1
    mirror = await stack.pool.fetchval(
        "SELECT fields->>'remote_id__c' FROM crm_record WHERE record_id = 'c-001'"
    )
    assert mirror == link["remote_id"]


async def test_a_patch_costs_one_activity_on_a_finalized_link(stack: Stack) -> None:
    """Issue 16 (P8 <= 3 per PATCH): the create step, finding the link finalized with a
    queued PATCH, sends it in the same activity; the run schedules no second one. Issue 32
    (WF-1'): the create's run has closed, so the PATCH's is a new run."""
    link = await finalized_contact(stack)
    handle = stack.handle(link["link_key"])
    created = await eventually(
        handle.describe, lambda d: d.status == WorkflowExecutionStatus.COMPLETED
    )
    await set_field(stack.pool, "Contact", "c-001", "FirstName", "Ada")
    assert isinstance(await stack.push("c-001"), PatchQueued)
    rows = await settled(stack, link["link_key"])
    assert [r["status"] for r in rows] == ["succeeded"] and len(await patches(stack)) == 1
    patched = await eventually(
        handle.describe,
        lambda d: d.run_id != created.run_id and d.status == WorkflowExecutionStatus.COMPLETED,
    )
    run = stack.client.get_workflow_handle(handle.id, run_id=patched.run_id)
    events = [e.event_type async for e in run.fetch_history_events()]
    scheduled = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    assert events.count(scheduled) == 1, events


async def test_rapid_saves_coalesce_into_at_most_two_patches(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    link = await finalized_contact(stack)
    # Hold the first PATCH in flight so later saves coalesce into one queued PATCH (long
    # enough for all 20 saves: the PATCH now leaves one activity sooner, issue 16; 3 s was
    # not on a loaded xdist worker), and under the 10 s HTTP timeout (REC-1), past which
    # the held PATCH would be ambiguous (C-2).
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="PATCH",
            path="/crm/v3/objects/contacts/*",
            action="delay_ms",
            delay_ms=6000,
            nth=1,
        )
    )
    for i in range(20):
        await set_field(stack.pool, "Contact", "c-001", "FirstName", f"v{i}")
        assert isinstance(await stack.push("c-001"), PatchQueued)
    assert await patches(stack) == []  # the premise: every save came while the first was held
    await settled(stack, link["link_key"])
    await eventually(
        lambda: remote_object(remote, "contacts", link["remote_id"]),
        lambda o: o["properties"]["firstname"] == "v19",
    )
    assert 1 <= len(await patches(stack)) <= 2


async def test_remote_404_suspends_as_remote_deleted_and_never_posts(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    link = await finalized_contact(stack)
    async with httpx.AsyncClient(base_url=remote.url) as http:
        await http.delete(f"/crm/v3/objects/contacts/{link['remote_id']}")
    assert isinstance(await stack.push("c-001"), PatchQueued)
    row = await suspended(stack, link["link_key"])
    assert row is not None and row["suspend_reason"] == "remote_deleted"
    assert len(await stack.sandbox.ledger(object_type="contacts", kind="create")) == 1


async def test_remote_409_suspends_as_remote_conflict(stack: Stack) -> None:
    link = await finalized_contact(stack)
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="PATCH", path="/crm/v3/objects/contacts/*", action="status", status=409
        )
    )
    assert isinstance(await stack.push("c-001"), PatchQueued)
    row = await suspended(stack, link["link_key"])
    assert row is not None and row["suspend_reason"] == "remote_conflict"


async def test_revoked_optional_field_is_left_out_and_required_fails_closed(
    stack: Stack,
) -> None:
    link = await finalized_contact(stack)
    await stack.pool.execute(
        "UPDATE crm_field_permission SET can_read = false "
        "WHERE user_id = 'alice' AND source_object = 'Contact' AND field_name = 'Phone'"
    )
    assert isinstance(await stack.push("c-001"), PatchQueued)
    rows = await settled(stack, link["link_key"])
    assert "phone" not in json.loads(rows[-1]["body"])["properties"]
    await stack.pool.execute(
        "UPDATE crm_field_permission SET can_read = false "
        "WHERE user_id = 'alice' AND source_object = 'Contact' AND field_name = 'Email'"
    )
    decision = await stack.push("c-001")
    assert isinstance(decision, Rejected)
    assert decision.reason in {RejectReason.FIELD_UNREADABLE, RejectReason.REQUIRED_FIELD_MISSING}
    assert len(await patches(stack)) == 1


async def test_ambiguous_patch_without_replay_safety_is_not_resent(stack: Stack) -> None:
    await finalized_contact(stack, "c-002")
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    key = company_key("a-002")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="PATCH", path="/crm/v3/objects/companies/*", action="reset_after_effect", nth=1
        )
    )
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    rows = await settled(stack, key)
    assert [r["status"] for r in rows] == ["ambiguous_remote_effect"]
    assert len(await patches(stack, "companies")) == 1
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"


async def test_ambiguous_patch_with_replay_safety_is_never_resent(stack: Stack) -> None:
    """P-50, SPEC §15 C-2 (overrides the replay-safe PATCH exception of PAT): the contacts'
    profile declares patchReplaySafe (no read-back). The PATCH lands and its answer is
    lost: it is never sent again, ends ambiguous_remote_effect, one PATCH in the ledger;
    a later save's PATCH is a new row and proceeds."""
    link = await finalized_contact(stack)
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="PATCH", path="/crm/v3/objects/contacts/*", action="reset_after_effect", nth=1
        )
    )
    await stack.push("c-001")
    rows = await settled(stack, link["link_key"])
    assert [r["status"] for r in rows] == ["ambiguous_remote_effect"]
    assert len(await patches(stack)) == 1
    current = await stack.link(link["link_key"])
    assert current is not None and current["status"] == "finalized"
    await stack.push("c-001")
    await eventually(
        lambda: patch_rows(stack, link["link_key"]),
        lambda rs: [r["status"] for r in rs] == ["ambiguous_remote_effect", "succeeded"],
    )
    assert len(await patches(stack)) == 2


async def finalized_deal(stack: Stack) -> asyncpg.Record:
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    link = await stack.link(key)
    assert link is not None and link["remote_etag"], "the create's ETag is kept"
    return link


async def push_deal(stack: Stack) -> None:
    decision = await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    assert isinstance(decision, PatchQueued)


async def test_precondition_follows_the_etag_across_patches(stack: Stack) -> None:
    link = await finalized_deal(stack)
    for amount in ("1", "2"):
        await set_field(stack.pool, "Opportunity", "o-001", "Amount", amount)
        await push_deal(stack)
        await settled(stack, link["link_key"])
    rows = await patch_rows(stack, link["link_key"])
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]
    current = await stack.link(link["link_key"])
    assert current is not None and current["remote_etag"] != link["remote_etag"]


async def test_out_of_band_change_is_412_and_suspends_without_overwriting(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    link = await finalized_deal(stack)
    async with httpx.AsyncClient(base_url=remote.url) as http:
        await http.patch(
            f"/crm/v3/objects/deals/{link['remote_id']}",
            json={"properties": {"dealname": "changed elsewhere"}},
        )
    await push_deal(stack)
    row = await suspended(stack, link["link_key"])
    assert row is not None and row["suspend_reason"] == "remote_conflict"
    obj = await remote_object(remote, "deals", link["remote_id"])
    assert obj["properties"]["dealname"] == "changed elsewhere"
