"""The create path end to end (SPEC WF-2, POST-1..4, REC-1, ID-5)."""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from protocol.admission import CreateReserved, ObservedActiveAttempt, Rejected
from protocol.errors import RejectReason
from sandbox.faults import FaultRuleSpec
from tests.e2e.conftest import Stack, contact_key, deal_key
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow


async def test_happy_path_creates_once_finalizes_and_mirrors(stack: Stack) -> None:
    decision = await stack.push("c-001")
    assert isinstance(decision, CreateReserved)
    key = contact_key("c-001")
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.object_id for e in creates] == [link["remote_id"]]
    assert attempt["remote_id"] == link["remote_id"] and attempt["mirror_status"] == "written"
    record = await stack.pool.fetchrow(
        "SELECT fields FROM crm_record WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    assert record is not None and f'"remote_id__c": "{link["remote_id"]}"' in record["fields"]


async def test_gate_rejection_writes_no_attempt(stack: Stack) -> None:
    decision = await stack.push("c-004")  # no Email: a required mapping
    assert isinstance(decision, Rejected)
    assert decision.reason in {
        RejectReason.REQUIRED_FIELD_MISSING,
        RejectReason.EMPTY_BODY,
        RejectReason.FIELD_UNREADABLE,
    }
    count = await stack.pool.fetchval("SELECT count(*) FROM connector_push_attempt")
    assert count == 0


async def test_concurrent_saves_of_one_record_create_once(stack: Stack) -> None:
    decisions = await asyncio.gather(*(stack.push("c-002") for _ in range(50)))
    assert sum(isinstance(d, CreateReserved) for d in decisions) == 1
    assert all(isinstance(d, CreateReserved | ObservedActiveAttempt) for d in decisions)
    key = contact_key("c-002")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    assert len(await stack.sandbox.ledger(object_type="contacts", kind="create")) == 1
    assert await stack.pool.fetchval("SELECT count(*) FROM connector_push_attempt") == 1
    assert await stack.pool.fetchval("SELECT count(*) FROM connector_remote_link") == 1


async def test_reset_after_effect_without_idempotency_parks_ambiguous(stack: Stack) -> None:
    # The company's primary contact must be linked first (else the deferred lane applies).
    await stack.push("c-002")
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/companies", action="reset_after_effect")
    )
    decision = await stack.push(
        "a-002", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, CreateReserved), decision
    key = decision.reservation.link_key
    attempt = await eventually(
        lambda: stack.attempt(key), lambda r: r["status"] == "ambiguous_remote_effect"
    )
    assert attempt["remote_io_started_at"] is not None
    assert len(await stack.sandbox.ledger(object_type="companies", kind="create")) == 1
    again = await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    assert isinstance(again, ObservedActiveAttempt)
    assert len(await stack.sandbox.ledger(object_type="companies", kind="create")) == 1


async def test_reset_after_effect_with_idempotency_resends_same_key(stack: Stack) -> None:
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path="/crm/v3/objects/contacts", nth=1, action="reset_after_effect"
        )
    )
    await stack.push("c-003")
    key = contact_key("c-003")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert len([e for e in creates if not e.replayed]) == 1
    assert len({e.idempotency_key for e in creates}) == 1


async def test_reset_after_effect_with_locator_contract_recovers(stack: Stack) -> None:
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path="/crm/v3/objects/deals", nth=1, action="reset_after_effect"
        )
    )
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    creates = await stack.sandbox.ledger(object_type="deals", kind="create")
    assert len(creates) == 1 and creates[0].object_id == attempt["remote_id"]


async def test_a_parked_link_stays_open_for_its_operator(stack: Stack) -> None:
    """A parked run waits without an idle timer, so `NeedsOperator = true AND
    ExecutionStatus = "Running"` lists exactly what needs a person (WF-4)."""
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/deals", action="status", status=422)
    )
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "terminal_failed")
    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)

    # The task that published the park has completed: whatever it scheduled is recorded.
    await eventually(
        handle.describe, lambda d: not d.raw_description.HasField("pending_workflow_task")
    )
    history = [e.event_type async for e in handle.fetch_history_events()]
    assert EventType.EVENT_TYPE_TIMER_STARTED not in history
    # No patch marker: the workflows have one baseline (SPEC VER-1, issue 32).
    assert EventType.EVENT_TYPE_MARKER_RECORDED not in history
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
