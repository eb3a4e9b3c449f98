"""The relay (SPEC WF-2): reservations whose wake-up never reached Temporal are dispatched.

`report_save(..., client=None)` is the CRM entry with Temporal unreachable: the
admission commits and nothing is woken. The last test stops a real (private)
Temporal server instead, saves while it is down, and restarts it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from cli.stack.temporal import TemporalDevServer
from protocol.admission import AdmissionDecision, CreateReserved, Rejected, SaveRequest
from protocol.errors import RejectReason
from protocol.relay import RelayInput, RelayResult
from sandbox.client import SandboxClient
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import OWNER, Stack, contact_key, deal_key
from tests.e2e.patch_support import Doc, apply_edit, mapping_rows
from tests.e2e.rig import Rig, private_temporal, rig_on
from tests.e2e.support import eventually
from worker.crm import report_save, workflow_id
from worker.schedules import ensure_relay_schedule, relay_schedule_id
from workflows import search_attributes as sa
from workflows.relay import RelayWorkflow


def _save(record_id: str, slot: str = "push-contact", obj: str = "Contact") -> SaveRequest:
    dest = {"push-contact": "remote-contacts", "push-deal": "remote-deals"}[slot]
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=slot,
        destination_slot_id=dest,
        source_object=obj,
        source_record_id=record_id,
        originating_user_id="alice",
    )


async def _save_while_temporal_down(stack: Stack, record_id: str) -> AdmissionDecision:
    decision = await report_save(stack.pool, None, stack.task_queue, _save(record_id))
    stack.touched.add(contact_key(record_id))
    return decision


async def _relay(stack: Stack, min_age_seconds: float = 0.0) -> RelayResult:
    return await stack.client.execute_workflow(
        RelayWorkflow.run,
        RelayInput(min_age_seconds=min_age_seconds, page_size=1),  # page size 1: paging runs
        id=f"relay-test/{uuid.uuid4().hex}",
        task_queue=stack.task_queue,
    )


async def _no_workflow(client: Client, key: str) -> bool:
    """No open run for the link (ids are per link key, so earlier tests' runs are closed)."""
    try:
        description = await client.get_workflow_handle(workflow_id(key)).describe()
    except RPCError as error:
        return error.status is RPCStatusCode.NOT_FOUND
    return description.status is not WorkflowExecutionStatus.RUNNING


async def _creates(sandbox: SandboxClient, object_type: str) -> list[str | None]:
    return [e.object_id for e in await sandbox.ledger(object_type=object_type, kind="create")]


async def test_reservation_made_while_temporal_was_unreachable_is_dispatched(
    stack: Stack,
) -> None:
    """The decision stands with nothing dispatched; one sweep wakes exactly the links with
    pending work (not the finalized one); a second sweep finds nothing; one create each."""
    await stack.push("c-002")
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )
    decisions = [await _save_while_temporal_down(stack, r) for r in ("c-001", "c-003")]
    assert all(isinstance(d, CreateReserved) for d in decisions)
    for record_id in ("c-001", "c-003"):
        assert (await stack.attempt(contact_key(record_id)))["status"] == "pending"
        assert await _no_workflow(stack.client, contact_key(record_id))
    assert len(await _creates(stack.sandbox, "contacts")) == 1

    result = await _relay(stack)
    assert result.woken == 2 and result.complete and result.pages == 3
    for record_id in ("c-001", "c-003"):
        await eventually(
            lambda r=record_id: stack.attempt(contact_key(r)), lambda a: a["status"] == "finalized"
        )
    assert (await _relay(stack)).woken == 0
    creates = await _creates(stack.sandbox, "contacts")
    assert len(creates) == 3 and len(set(creates)) == 3
    # OPS-1: a run the relay started is summarised from the key's rows like any other.
    described = await stack.handle(contact_key("c-003")).describe()
    assert await described.static_summary() == (
        "Contact c-003 → remote-contacts via push-contact (demo-owner)"
    )


async def test_relay_leaves_fresh_reservations_to_their_own_wake_up(stack: Stack) -> None:
    """Rows younger than `min_age` are not swept, so a sweep never races a live save."""
    assert isinstance(await _save_while_temporal_down(stack, "c-001"), CreateReserved)
    assert (await _relay(stack, min_age_seconds=3600)).woken == 0
    assert (await stack.attempt(contact_key("c-001")))["status"] == "pending"
    assert await _no_workflow(stack.client, contact_key("c-001"))


async def test_relay_schedule_is_created_idempotently_and_dispatches(stack: Stack) -> None:
    """What `connector-push worker` does at start, twice (a restart or a second worker);
    triggering the schedule runs a sweep that dispatches the stranded reservation."""
    relay = RelayInput(min_age_seconds=0)
    handle = await ensure_relay_schedule(stack.client, stack.task_queue, relay=relay)
    try:
        again = await ensure_relay_schedule(stack.client, stack.task_queue, relay=relay)
        assert again.id == handle.id == relay_schedule_id(stack.task_queue)
        described = await handle.describe()
        [interval] = described.schedule.spec.intervals
        assert interval.every == timedelta(seconds=30)
        assert isinstance(await _save_while_temporal_down(stack, "c-001"), CreateReserved)
        await handle.trigger()
        attempt = await eventually(
            lambda: stack.attempt(contact_key("c-001")), lambda a: a["status"] == "finalized"
        )
        assert await _creates(stack.sandbox, "contacts") == [attempt["remote_id"]]
    finally:
        await handle.delete()


# -- a real outage: a private Temporal server stopped and restarted ---------------------


@pytest.fixture
def outage_temporal(tmp_path: Path) -> Iterator[TemporalDevServer]:
    with private_temporal(tmp_path) as server:
        yield server


@pytest.fixture
async def outage_rig(
    outage_temporal: TemporalDevServer, demo_db: asyncpg.Pool, sandbox: SandboxClient
) -> AsyncIterator[Rig]:
    async with rig_on(outage_temporal, demo_db, sandbox, "outage") as rig:
        yield rig


async def test_saves_admitted_during_a_temporal_outage_are_dispatched_once_after_it(
    outage_rig: Rig, outage_temporal: TemporalDevServer
) -> None:
    rig, stack = outage_rig, outage_rig.stack
    outage_temporal.stop()
    records = [("c-001", "push-contact", "Contact"), ("o-001", "push-deal", "Opportunity")]
    saves = [_save(r, slot, obj) for r, slot, obj in records]
    decisions = await asyncio.gather(
        *(report_save(stack.pool, stack.client, stack.task_queue, s) for s in saves)
    )
    assert all(isinstance(d, CreateReserved) for d in decisions)  # the wake-up failed
    keys = [contact_key("c-001"), deal_key("o-001")]
    stack.touched.update(keys)

    outage_temporal.start()
    await outage_temporal.wait_ready()
    await rig.start_worker()
    for key in keys:
        assert (await stack.attempt(key))["status"] == "pending"
    assert (await _relay(stack)).woken == 2
    for key in keys:
        await eventually(lambda k=key: stack.attempt(k), lambda a: a["status"] == "finalized")
    assert len(await _creates(stack.sandbox, "contacts")) == 1
    assert len(await _creates(stack.sandbox, "deals")) == 1


async def _finalized_and_closed(stack: Stack, record_id: str) -> str:
    """Push a contact until its link is finalized and its run has ended; its link key."""
    await stack.push(record_id)
    key = contact_key(record_id)
    await eventually(lambda: stack.attempt(key), lambda a: a["status"] == "finalized")
    await eventually(
        lambda: stack.handle(key).describe(),
        lambda d: d.status is WorkflowExecutionStatus.COMPLETED,
    )
    return key


async def _woken_once_and_listed(stack: Stack, key: str) -> None:
    """The flagged link is woken by the relay with no age wait, its run stays open with
    NeedsOperator (the operator's query lists it), and the flag is cleared."""
    assert (await _relay(stack, min_age_seconds=3600)).woken == 1
    await eventually(
        lambda: stack.handle(key).describe(),
        lambda d: (
            d.status is WorkflowExecutionStatus.RUNNING
            and d.typed_search_attributes.get(sa.NEEDS_OPERATOR) is True
        ),
    )
    link = await stack.link(key)
    assert link is not None and not link["wake_pending"]


async def test_a_link_suspended_by_a_slot_removal_is_woken_once_and_listed(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """WF-4, C-9 (found by the chaos campaign's pack_apply actor): `pack apply` suspends
    the finalized links of a removed action slot where no workflow runs. They are flagged,
    and the relay wakes each once: its run loads the link, finds it suspended and stays
    open with NeedsOperator, so the operator's query lists it; the flag is cleared."""
    key = await _finalized_and_closed(stack, "c-001")

    def recreated(doc: Doc) -> None:
        doc["actionSlots"][0]["id"] = "push-contact-v2"
        for slot in doc["actionSlots"]:
            for association in slot.get("associations", []):
                if association["targetActionSlot"] == "push-contact":
                    association["targetActionSlot"] = "push-contact-v2"
        doc["lineage"] = []

    await apply_edit(stack.pool, remote, recreated)
    link = await stack.link(key)
    assert link is not None and link["status"] == "suspended_drift" and link["wake_pending"]
    await _woken_once_and_listed(stack, key)
    assert (await _relay(stack, min_age_seconds=0)).woken == 0  # once


async def test_a_link_a_save_suspends_while_its_wake_up_fails_is_woken_by_the_relay(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """WF-2, DRIFT-2 (chaos seed 101: 8 links suspended `drift:mapping` listed by nobody):
    a save refused for drift suspends the finalized link in its admission, where no run
    may be going, and its wake-up is best effort. When that wake-up does not happen
    (Temporal unreachable: no client here), the flag makes the relay wake the link once,
    so its run lists it for an operator."""
    key = await _finalized_and_closed(stack, "c-002")
    await apply_edit(stack.pool, remote, mapping_rows)
    decision = await report_save(stack.pool, None, stack.task_queue, _save("c-002"))
    assert isinstance(decision, Rejected) and decision.reason is RejectReason.DRIFT_FAIL_CLOSED
    link = await stack.link(key)
    assert link is not None and link["status"] == "suspended_drift" and link["wake_pending"]
    await _woken_once_and_listed(stack, key)
