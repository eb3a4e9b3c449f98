"""Deferred association lane (SPEC LANE-2..4): a company saved before its primary contact."""

from __future__ import annotations

from protocol.admission import DeferredAssociationReserved, ObservedActiveAttempt
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.support import eventually
from tests.e2e.test_patch_path import remote_object


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
