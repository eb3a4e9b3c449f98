"""The PATCH path and drift through the workflow (SPEC PATCH-1..3, DRIFT-2, WF-3 revalidate)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError

from protocol.admission import PatchQueued, Rejected
from protocol.errors import RejectReason
from protocol.messages import RevalidateInput
from protocol.revalidation_manifest import Approval
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from services.revalidation_owner import OwnerOutcome, OwnerRequest, OwnerResult, revalidate_owner
from tests.e2e.conftest import OWNER, Stack, company_key, contact_key, deal_key, demo_manifest
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow

Doc = dict[str, Any]


async def finalized_contact(stack: Stack, record_id: str = "c-001") -> asyncpg.Record:
    await stack.push(record_id)
    await eventually(
        lambda: stack.attempt(contact_key(record_id)), lambda r: r["status"] == "finalized"
    )
    link = await stack.link(contact_key(record_id))
    assert link is not None
    return link


async def set_field(pool: asyncpg.Pool, obj: str, record_id: str, field: str, value: str) -> None:
    await pool.execute(
        "UPDATE crm_record SET fields = fields || jsonb_build_object($3::text, $4::text) "
        "WHERE source_object = $1 AND record_id = $2",
        obj,
        record_id,
        field,
        value,
    )


async def patches(stack: Stack, object_type: str = "contacts") -> list[Any]:
    return await stack.sandbox.ledger(object_type=object_type, kind="patch")


async def patch_rows(stack: Stack, key: str) -> list[asyncpg.Record]:
    return await stack.pool.fetch(
        "SELECT * FROM connector_patch_dispatch WHERE link_key = $1 ORDER BY created_at", key
    )


async def settled(stack: Stack, key: str) -> list[asyncpg.Record]:
    """Wait until no PATCH of the link is queued or in flight."""
    return await eventually(
        lambda: patch_rows(stack, key),
        lambda rows: bool(rows) and all(r["status"] not in ("pending", "processing") for r in rows),
    )


async def suspended(stack: Stack, key: str) -> asyncpg.Record | None:
    return await eventually(
        lambda: stack.link(key), lambda r: r is not None and r["status"] == "suspended_drift"
    )


async def remote_object(remote: BackgroundSandbox, object_type: str, remote_id: str) -> Doc:
    async with httpx.AsyncClient(base_url=remote.url) as http:
        response = await http.get(f"/crm/v3/objects/{object_type}/{remote_id}")
    body: Doc = response.json()
    return body


async def apply_edit(
    pool: asyncpg.Pool, remote: BackgroundSandbox, edit: Callable[[Doc], None], **kw: bool
) -> None:
    doc = demo_manifest(remote.url)
    edit(doc)
    async with pool.acquire() as conn:
        await apply_pack(conn, doc, **kw)


def contact_slot(doc: Doc) -> Doc:
    slot: Doc = doc["actionSlots"][0]  # type: ignore[index]
    return slot


def contact_profile(doc: Doc) -> Doc:
    profile: Doc = doc["profiles"][0]  # type: ignore[index]
    return profile


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
    queued PATCH, sends it in the same activity; the run schedules no second one."""
    link = await finalized_contact(stack)
    handle = stack.handle(link["link_key"])
    await eventually(
        handle.describe, lambda d: not d.raw_description.HasField("pending_workflow_task")
    )
    before = [e.event_type async for e in handle.fetch_history_events()]
    await set_field(stack.pool, "Contact", "c-001", "FirstName", "Ada")
    assert isinstance(await stack.push("c-001"), PatchQueued)
    rows = await settled(stack, link["link_key"])
    assert [r["status"] for r in rows] == ["succeeded"] and len(await patches(stack)) == 1
    await eventually(
        handle.describe, lambda d: not d.raw_description.HasField("pending_workflow_task")
    )
    after = [e.event_type async for e in handle.fetch_history_events()][len(before) :]
    scheduled = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED in after
    assert after.count(scheduled) == 1, after


async def test_rapid_saves_coalesce_into_at_most_two_patches(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    link = await finalized_contact(stack)
    # Hold the first PATCH in flight so later saves coalesce into one queued PATCH (long
    # enough for all 20 saves: the PATCH now leaves one activity sooner, issue 16).
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="PATCH",
            path="/crm/v3/objects/contacts/*",
            action="delay_ms",
            delay_ms=3000,
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


def reinstall(doc: Doc) -> None:
    del doc  # same manifest, new incarnation


def credential_ref(doc: Doc) -> None:
    contact_profile(doc)["credentialRef"] = "env:OTHER_TOKEN"


def endpoint_class(doc: Doc) -> None:
    contact_profile(doc)["endpointClass"] = "objects-api-v2"


def update_path(doc: Doc) -> None:
    contact_slot(doc)["updatePath"] = "/crm/v4/objects/{target}/{remoteId}"


def mapping_rows(doc: Doc) -> None:
    contact_slot(doc)["mappings"].append({"sourceField": "Title", "remoteProperty": "jobtitle"})


def target_new_slot(doc: Doc) -> None:
    doc["destinationSlots"][0]["id"] = "remote-people"  # type: ignore[index]
    doc["destinationSlots"][0]["targetObject"] = "people"  # type: ignore[index]
    contact_slot(doc)["destinationSlot"] = "remote-people"


def remote_scope(doc: Doc) -> None:
    doc["destinationSlots"][0]["remoteScope"] = "other-portal"  # type: ignore[index]


def base_url(doc: Doc) -> None:
    contact_profile(doc)["baseUrl"] = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("edit", "reinstalled", "surface"),
    [
        pytest.param(reinstall, True, "pack_install", id="install-changed"),
        pytest.param(credential_ref, False, "credential_ref", id="credential-ref"),
        pytest.param(endpoint_class, False, "endpoint", id="endpoint-class"),
        pytest.param(base_url, False, "endpoint", id="base-url"),
        pytest.param(update_path, False, "update_path", id="update-path"),
        pytest.param(mapping_rows, False, "mapping", id="mapping-rows"),
        pytest.param(target_new_slot, False, "target_new_slot", id="target-new-destination-slot"),
        pytest.param(remote_scope, False, "remote_scope", id="remote-scope"),
    ],
)
async def test_fail_closed_drift_suspends_and_sends_nothing(
    stack: Stack,
    remote: BackgroundSandbox,
    edit: Callable[[Doc], None],
    reinstalled: bool,
    surface: str,
) -> None:
    """DRIFT-2; issue 14 item 7: `suspend_reason` names the surface (`drift:endpoint`)."""
    link = await finalized_contact(stack)
    await apply_edit(stack.pool, remote, edit, reinstall=reinstalled)
    decision = await stack.push("c-001")
    assert isinstance(decision, Rejected) and decision.reason is RejectReason.DRIFT_FAIL_CLOSED
    row = await suspended(stack, link["link_key"])
    assert row is not None and row["suspend_reason"] == f"drift:{surface}"
    findings = json.loads(row["drift_findings"])
    assert any(f["disposition"] == "fail_closed" for f in findings)
    if edit is base_url:  # the binding that changed, not "objects-api -> objects-api"
        (endpoint,) = [f for f in findings if f["surface"] == "endpoint"]
        assert endpoint["detail"] == "base URL " + remote.url + " -> http://127.0.0.1:9"
    view = await eventually(
        lambda: stack.handle(link["link_key"]).query(LinkWorkflow.state), lambda v: v.needs_operator
    )
    assert view.suspend_reason == f"drift:{surface}"
    assert await patches(stack) == []


def flow_version(doc: Doc) -> None:
    contact_slot(doc)["flowVersion"] = "2"


def action_rename(doc: Doc) -> None:
    contact_slot(doc)["flowActionName"] = "Push_Person"


def retry_policy(doc: Doc) -> None:
    contact_profile(doc)["retryPolicy"] = {"maxAttempts": 9, "initialIntervalMs": 100}


async def revalidate_owner_now(pool: asyncpg.Pool) -> OwnerResult:
    """`connector-push revalidate owner` for the demo owner (C-4: after every new install)."""
    approval = Approval(approved_by="op", approval_reference="CHG-1", reason="new install")
    request = OwnerRequest(connector_owner_key=OWNER, approval=approval)
    async with pool.acquire() as conn:
        result = await revalidate_owner(conn, request, now=datetime.now(UTC))
    assert result.outcome is OwnerOutcome.APPLIED, result
    return result


@pytest.mark.parametrize("edit", [flow_version, action_rename, retry_policy])
async def test_benign_drift_patches_and_records_findings(
    stack: Stack, remote: BackgroundSandbox, edit: Callable[[Doc], None]
) -> None:
    """Benign surfaces PATCH once the new install is revalidated (C-4, P-10: an apply is a
    new install, and the link fails closed until then; test_install_fail_closed.py)."""
    link = await finalized_contact(stack)
    await apply_edit(stack.pool, remote, edit)
    await revalidate_owner_now(stack.pool)
    decision = await stack.push("c-001")
    assert isinstance(decision, PatchQueued), decision
    rows = await settled(stack, link["link_key"])
    assert [r["status"] for r in rows] == ["succeeded"]
    row = await stack.link(link["link_key"])
    assert row is not None and row["status"] == "finalized"
    assert json.loads(row["drift_findings"]), "benign findings are recorded"
    assert len(await patches(stack)) == 1


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


async def test_revalidate_restores_a_suspended_link_and_rejects_a_finalized_one(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    link = await finalized_contact(stack)
    handle = stack.handle(link["link_key"])
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(
            LinkWorkflow.revalidate, RevalidateInput(operator="op", reason="not suspended")
        )
    await apply_edit(stack.pool, remote, credential_ref)
    await stack.push("c-001")
    await suspended(stack, link["link_key"])
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    result = await handle.execute_update(
        LinkWorkflow.revalidate, RevalidateInput(operator="op", reason="credential rotated")
    )
    assert result.view.link_status == "finalized"
    row = await stack.link(link["link_key"])
    assert row is not None and row["credential_ref"] == "env:OTHER_TOKEN"
    assert row["last_operator"] == "op"
    assert isinstance(await stack.push("c-001"), PatchQueued)
    await settled(stack, link["link_key"])
    assert len(await patches(stack)) == 1


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
