"""Deferred association lane (SPEC LANE-2..4): a company saved before its primary contact."""

from __future__ import annotations

from protocol.admission import DeferredAssociationReserved, ObservedActiveAttempt
from protocol.identity import link_workflow_id
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from tests.e2e.conftest import Stack, company_key, contact_key, demo_manifest
from tests.e2e.patch_support import remote_object
from tests.e2e.support import eventually
from tests.e2e.test_operator import WHO, _cli, cli_env  # noqa: F401 (cli_env: a fixture)


async def test_company_waits_for_its_contact_then_posts_with_the_association(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    decision = await stack.push(
        "a-001", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, DeferredAssociationReserved)
    assert decision.waiting_on == ("primary-contact",)
    key = company_key("a-001")
    attempt = await stack.attempt(key)
    assert attempt["dispatch_lane"] == "deferred_association" and attempt["status"] == "pending"
    # LANE-4: another save while deferred observes it; no POST from the request path.
    again = await stack.push("a-001", slot="push-company", obj="Account", dest="remote-companies")
    assert isinstance(again, ObservedActiveAttempt)
    assert await stack.sandbox.ledger(object_type="companies", kind="create") == []
    # The target finalizes; its workflow wakes the company's (no re-check wait needed).
    await stack.push("c-001")
    contact = await eventually(
        lambda: stack.attempt(contact_key("c-001")), lambda r: r["status"] == "finalized"
    )
    company = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    assert len(await stack.sandbox.ledger(object_type="companies", kind="create")) == 1
    obj = await remote_object(remote, "companies", company["remote_id"])
    assert obj["properties"]["primary_contact_id"] == contact["remote_id"]


async def test_deferred_attempt_uses_the_frozen_source_id_not_a_later_value(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    await stack.push("a-001", slot="push-company", obj="Account", dest="remote-companies")
    # The lookup field changes after the save: the frozen vector (c-001) still decides.
    await stack.pool.execute(
        'UPDATE crm_record SET fields = fields || \'{"PrimaryContactId": "c-002"}\' '
        "WHERE source_object = 'Account' AND record_id = 'a-001'"
    )
    await stack.push("c-002")
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )
    attempt = await stack.attempt(company_key("a-001"))
    assert attempt["status"] == "pending", "c-002 is not the frozen target"
    await stack.push("c-001")
    contact = await eventually(
        lambda: stack.attempt(contact_key("c-001")), lambda r: r["status"] == "finalized"
    )
    company = await eventually(
        lambda: stack.attempt(company_key("a-001")), lambda r: r["status"] == "finalized"
    )
    obj = await remote_object(remote, "companies", company["remote_id"])
    assert obj["properties"]["primary_contact_id"] == contact["remote_id"]


async def test_a_target_finalized_by_reconcile_wakes_the_company_waiting_on_it(
    stack: Stack,
    remote: BackgroundSandbox,
    cli_env: dict[str, str],  # noqa: F811 (the fixture imported above)
) -> None:
    """LANE-2: the wake-up comes from the target's workflow whichever way it finalized.
    A reconcile finalizes outside the create path; this stack runs no relay, so without
    the wake-up the company would wait for ever."""
    # Contacts without POST idempotency, so one lost answer parks the contact ambiguous.
    manifest = demo_manifest(remote.url)
    for slot in manifest["destinationSlots"]:  # type: ignore[attr-defined]
        if slot["id"] == "remote-contacts":
            slot["profile"] = "sandbox-plain"
    async with stack.pool.acquire() as conn:
        await apply_pack(conn, manifest)
    await stack.push("a-001", slot="push-company", obj="Account", dest="remote-companies")
    company = company_key("a-001")
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path="/crm/v3/objects/contacts", action="reset_after_effect", times=1
        )
    )
    await stack.push("c-001")
    contact = contact_key("c-001")
    await eventually(
        lambda: stack.attempt(contact), lambda r: r["status"] == "ambiguous_remote_effect"
    )
    await stack.sandbox.clear_faults()
    [entry] = await stack.sandbox.ledger(object_type="contacts", kind="create")
    object_id = entry.object_id
    assert object_id is not None
    args = ["reconcile", contact, "--remote-id", object_id, "--evidence", "ledger", *WHO]
    result = await _cli(cli_env, *args)
    assert result.exit_code == 0, result.output
    attempt = await eventually(
        lambda: stack.attempt(company), lambda r: r["status"] == "finalized", timeout_s=90.0
    )
    # Woken by the contact's workflow, not by the company's own periodic re-check.
    history = await stack.client.get_workflow_handle(link_workflow_id(company)).fetch_history()
    senders = {
        e.workflow_execution_signaled_event_attributes.external_workflow_execution.workflow_id
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
    }
    assert link_workflow_id(contact) in senders
    obj = await remote_object(remote, "companies", attempt["remote_id"])
    assert obj["properties"]["primary_contact_id"] == object_id
