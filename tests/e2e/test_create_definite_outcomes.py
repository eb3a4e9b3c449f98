"""Create-path outcomes end to end that end or divert a create without ambiguity: a
definite rejection and its supersede, a mirror conflict, a source deleted before the
POST or the writeback, and a remote id another record already links (ID-4).

Real Postgres, a real Temporal server and the sandbox remote over HTTP; the test
starts the workers (`Rig`).
"""

from __future__ import annotations

from temporalio.client import WorkflowHandle

from protocol.admission import CreateReserved, Rejected, SaveRequest
from protocol.errors import RejectReason
from protocol.messages import SupersedeInput
from sandbox.faults import FaultRuleSpec
from tests.e2e.conftest import OWNER, contact_key
from tests.e2e.create_faults_support import (
    CONTACTS,
    creates,
    parked_ids,
    record_fields,
    status_of,
)
from tests.e2e.create_faults_support import rig as rig  # the fixture
from tests.e2e.rig import Rig, SteerableHooks
from tests.e2e.support import eventually
from worker.crm import report_save, wake_link, workflow_id
from workflows.link import LinkWorkflow

# -- definite rejection and operator supersede ------------------------------------------


async def test_remote_422_is_terminal_blocks_saves_until_superseded(rig: Rig) -> None:
    """POST-4 / ID-5: 422 → terminal_failed; a save is rejected while it stands; the
    operator's supersede reserves attempt #2, which creates."""
    stack = rig.stack
    await rig.start_worker()
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="status", status=422)
    )
    await stack.push("c-001")
    key = contact_key("c-001")
    failed = await status_of(stack, key, "terminal_failed")
    assert failed["attempt_ordinal"] == 1
    again = await stack.push("c-001")
    assert isinstance(again, Rejected)
    assert again.reason is RejectReason.UNSUPERSEDED_TERMINAL_ATTEMPT
    assert await creates(stack, "contacts") == []

    await stack.sandbox.clear_faults()
    # The parked run has loaded the link's state (its validator refuses "still loading"
    # before that, as the UI would show an operator who clicked too early).
    await eventually(
        lambda: stack.handle(key).query(LinkWorkflow.state), lambda view: view.needs_operator
    )
    result = await stack.handle(key).execute_update(
        LinkWorkflow.supersede,
        SupersedeInput(operator="ops@example.com", reason="payload fixed upstream"),
    )
    assert result.accepted and "#2" in result.message
    attempt = await status_of(stack, key, "finalized")
    assert attempt["attempt_ordinal"] == 2
    old = await stack.pool.fetchrow(
        "SELECT status, superseded_by FROM connector_push_attempt WHERE attempt_id = $1",
        failed["attempt_id"],
    )
    assert old is not None and old["status"] == "superseded"
    assert old["superseded_by"] == attempt["attempt_id"]
    assert await creates(stack, "contacts") == [attempt["remote_id"]]


# -- mirror and source deletion ---------------------------------------------------------


async def test_mirror_conflict_retries_the_mirror_only(rig: Rig) -> None:
    """POST-3: a foreign value in the mirror field fails the CAS; the link is finalized and
    the attempt waits in writeback_pending; once the field is free the mirror retry writes
    it — and the remote still saw exactly one create."""
    stack = rig.stack
    hooks = SteerableHooks()

    async def foreign_mirror(attempt_id: str) -> None:
        await stack.pool.execute(
            'UPDATE crm_record SET fields = fields || \'{"remote_id__c": "foreign-9"}\' '
            "WHERE source_object = 'Contact' AND record_id = 'c-001'"
        )

    hooks.before = foreign_mirror
    await rig.start_worker(hooks)
    await stack.push("c-001")
    key = contact_key("c-001")
    pending = await status_of(stack, key, "writeback_pending")
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"
    # At least one mirror retry has failed on the conflict before the field is freed.
    await eventually(lambda: _mirror_failures(stack.handle(key)), lambda n: n >= 1, timeout_s=30)
    await stack.pool.execute(
        "UPDATE crm_record SET fields = fields - 'remote_id__c' "
        "WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    attempt = await status_of(stack, key, "finalized")
    assert attempt["mirror_status"] == "written"
    assert f'"remote_id__c": "{pending["remote_id"]}"' in await record_fields(
        stack, "Contact", "c-001"
    )
    assert await creates(stack, "contacts") == [pending["remote_id"]]
    assert hooks.tries == 1


async def _mirror_failures(handle: WorkflowHandle[object, object]) -> int:
    """Failed tries of the pending mirror activity (reported on the scheduled event)."""
    description = await handle.describe()
    raw = description.raw_description
    return sum(
        p.attempt - 1 for p in raw.pending_activities if p.activity_type.name == "write_mirror"
    )


async def test_source_deleted_before_writeback_keeps_link_and_skips_mirror(rig: Rig) -> None:
    """POST-3: the record is deleted after the claim; the create lands, the link is kept,
    and the mirror is `skipped_source_deleted` (the record is never recreated)."""
    stack = rig.stack
    hooks = SteerableHooks()

    async def delete_source(attempt_id: str) -> None:
        await stack.pool.execute(
            "UPDATE crm_record SET deleted = true "
            "WHERE source_object = 'Contact' AND record_id = 'c-001'"
        )

    hooks.before = delete_source
    await rig.start_worker(hooks)
    await stack.push("c-001")
    key = contact_key("c-001")
    attempt = await status_of(stack, key, "finalized")
    assert attempt["mirror_status"] == "skipped_source_deleted"
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"
    assert link["mirror_status"] == "skipped_source_deleted"
    assert await creates(stack, "contacts") == [attempt["remote_id"]]
    assert "remote_id__c" not in await record_fields(stack, "Contact", "c-001")


async def test_source_deleted_before_post_fails_closed(rig: Rig) -> None:
    """POST-1: admitted while the record existed, deleted before the workflow ran: the
    claim re-checks the source and fails closed with no POST."""
    stack = rig.stack
    await rig.start_worker()
    save = SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id="push-contact",
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id="c-001",
        originating_user_id="alice",
    )
    decision = await report_save(stack.pool, None, rig.task_queue, save)  # nobody woken
    assert isinstance(decision, CreateReserved)
    key = contact_key("c-001")
    stack.touched.add(key)
    await stack.pool.execute(
        "UPDATE crm_record SET deleted = true "
        "WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    await wake_link(stack.client, rig.task_queue, key, None)
    attempt = await status_of(stack, key, "terminal_failed")
    assert attempt["last_error"] == "source_deleted"
    assert attempt["remote_io_started_at"] is None
    assert await creates(stack, "contacts") == []
    assert await stack.link(key) is None


# -- remote locator uniqueness ----------------------------------------------------------


async def test_same_remote_id_for_two_records_parks_the_second(rig: Rig) -> None:
    """ID-4: the remote answers a second record's create with the id it already gave the
    first (a de-duplicating or merging remote). Crafted reliably with a `status` fault
    whose body is the first object's HubSpot representation: the runtime reads a clean
    201 with a remote id some other link owns. The unique locator index refuses the second
    link; the attempt parks `stale_remote_locator` — ambiguous, not terminal, because its
    create may have landed (JRN-2) — naming the owning link; no two links claim the id."""
    stack = rig.stack
    await rig.start_worker()
    await stack.push("c-001")
    first = await status_of(stack, contact_key("c-001"), "finalized")
    remote_id = first["remote_id"]
    [existing] = await stack.sandbox.objects("contacts")
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="status", status=201, body=existing)
    )
    await stack.push("c-002")
    key = contact_key("c-002")
    second = await status_of(stack, key, "ambiguous_remote_effect")
    assert second["last_error"] is not None and "stale_remote_locator" in second["last_error"]
    assert contact_key("c-001") in second["last_error"]
    assert await stack.link(key) is None
    owners = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_remote_link WHERE remote_id = $1", remote_id
    )
    assert owners == 1
    assert await creates(stack, "contacts") == [remote_id]
    ids = await eventually(lambda: parked_ids(stack.client, key), lambda ids: bool(ids))
    assert ids == [workflow_id(key)]
