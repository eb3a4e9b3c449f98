"""Fail-closed evidence end to end (SPEC §15 C-1, C-2, C-3; seed rows P-77, P-49, P-50,
P-23, P-55).

Real Postgres, a real Temporal server and the sandbox over HTTP. A try that may
have landed is never followed by a terminal end, a supersede, a re-sent PATCH or
a replayed deferred create: the remote's ledger is the witness.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from temporalio.client import WorkflowUpdateFailedError

from db import journal as jq
from protocol.admission import (
    CreateReserved,
    DeferredAssociationReserved,
    ObservedActiveAttempt,
    PatchQueued,
)
from protocol.messages import SupersedeInput
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from services.rows import jsonb, request_of
from services.wake import wake_link
from tests.e2e.conftest import Stack, company_key, contact_key, deal_key, demo_manifest
from tests.e2e.rig import Rig, SteerableHooks
from tests.e2e.support import eventually
from tests.e2e.test_create_faults import rig  # noqa: F401 (a fixture)
from tests.e2e.test_operator import WHO, _cli, cli_env  # noqa: F401 (cli_env: a fixture)
from tests.e2e.test_seed_rows import _abandoned_patch, _finalized, _save
from tests.e2e.test_seed_rows import _patches as _seed_patches
from workflows.link import LinkWorkflow

CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"
DEALS = "/crm/v3/objects/deals/*"


async def _status(stack: Stack, key: str, status: str, timeout_s: float = 60) -> asyncpg.Record:
    return await eventually(lambda: stack.attempt(key), lambda r: r["status"] == status, timeout_s)


async def _journal(stack: Stack, attempt_id: object) -> list[asyncpg.Record]:
    async with stack.pool.acquire() as conn:
        return await jq.attempt_journal(conn, str(attempt_id))


async def _creates(stack: Stack, object_type: str) -> list[Any]:
    return await stack.sandbox.ledger(object_type=object_type, kind="create")


# -- C-1 / P-77: no terminal end and no supersede after a try that may have landed ------


@pytest.mark.parametrize("answer", [422, 409])
async def test_a_refused_same_key_resend_parks_ambiguous_and_supersede_is_refused(
    stack: Stack,
    cli_env: dict[str, str],  # noqa: F811 (the fixture imported above)
    answer: int,
) -> None:
    """P-77, SPEC §15 C-1. Idempotency-Key profile: try 1 lands and its answer is lost
    (`reset_after_effect`); the same-key re-send is answered 422 (or 409). Before: the 422
    ended the attempt terminal_failed and `supersede` reserved attempt #2, which POSTed a
    second object. Now: ambiguous_remote_effect, supersede refused (CLI exit 1, naming
    reconcile, and the UI update too), Postgres refuses both moves, one remote object."""
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="reset_after_effect", nth=1)
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="status", status=answer, nth=2)
    )
    assert isinstance(await stack.push("c-001"), CreateReserved)
    key = contact_key("c-001")
    parked = await _status(stack, key, "ambiguous_remote_effect")
    journal = await _journal(stack, parked["attempt_id"])
    assert [(r["outcome"], r["status"]) for r in journal] == [
        ("no_answer", None),
        ("answered", answer),
    ]
    assert "may have landed" in parked["last_error"] or "status_409" in parked["last_error"]
    await stack.sandbox.clear_faults()

    result = await _cli(cli_env, "supersede", key, *WHO)
    assert result.exit_code == 1, result.output
    assert "supersede does not apply" in result.output
    assert "reconcile" in result.output
    handle = stack.handle(key)
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(
            LinkWorkflow.supersede,
            SupersedeInput(operator="ops", reason="looks failed", reserve_next=True),
        )
    # Postgres has the last word, whatever a caller skips (migration 0100).
    for status in ("terminal_failed", "superseded"):
        with pytest.raises(asyncpg.PostgresError):
            await stack.pool.execute(
                "UPDATE connector_push_attempt SET status = $2 WHERE attempt_id = $1",
                parked["attempt_id"],
                status,
            )
    shown = await _cli(cli_env, "links", "show", key, "--json")
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.output)
    assert view["park_reason"] == "ambiguous_remote_effect"
    assert "reconcile" in view["remedy"] and "Supersede is refused" in view["remedy"]

    attempt = await stack.attempt(key)
    assert attempt["status"] == "ambiguous_remote_effect" and attempt["attempt_ordinal"] == 1
    assert len(await _creates(stack, "contacts")) == 1, "one local record, one remote object"


# -- C-3 / P-49: a deferred-lane create that may have landed is never replayed ----------


async def test_a_deferred_create_is_never_replayed_even_on_a_replay_safe_profile(
    rig: Rig,  # noqa: F811 (the fixture imported above)
    remote: BackgroundSandbox,
) -> None:
    """P-49, SPEC §15 C-3. The companies' destination uses the Idempotency-Key profile, so
    a configured-lane create would be re-sent with its key. A company saved before its
    primary contact waits in the deferred lane; once the contact is linked its POST lands
    and hangs (`hang_after_effect`) and the worker is killed. Before: the new worker
    re-sent it (the remote replayed: two ledger entries). Now: ambiguous, one entry."""
    stack = rig.stack
    manifest = demo_manifest(remote.url)
    for slot in manifest["destinationSlots"]:  # type: ignore[attr-defined]
        if slot["id"] == "remote-companies":
            slot["profile"] = "sandbox-idempotent"
    async with stack.pool.acquire() as conn:
        await apply_pack(conn, manifest)
    await rig.start_worker()
    decision = await stack.push(
        "a-001", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, DeferredAssociationReserved)
    key = company_key("a-001")
    frozen = request_of(await stack.attempt(key))
    assert frozen.profile.post_replay_safe and frozen.pending_associations
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, nth=1, action="hang_after_effect")
    )
    await stack.push("c-001")
    await eventually(lambda: _creates(stack, "companies"), lambda c: len(c) == 1)
    attempt = await stack.attempt(key)
    assert attempt["dispatch_lane"] == "deferred_association"
    assert attempt["remote_io_started_at"] is not None

    await rig.stop_worker()
    await rig.start_worker()
    parked = await _status(stack, key, "ambiguous_remote_effect")
    assert "deferred-lane create is never replayed" in parked["last_error"]
    entries = await _creates(stack, "companies")
    assert [e.replayed for e in entries] == [False], "never replayed"


# -- C-2 / P-50: a PATCH that may have landed is never sent again -------------------------


async def test_a_patch_lost_with_its_worker_is_proved_by_read_back_not_resent(
    rig: Rig,  # noqa: F811 (the fixture imported above)
) -> None:
    """P-50, SPEC §15 C-2. Deals: patchReplaySafe + If-Match + read-back. The PATCH lands
    and hangs; the worker is killed. The new worker does not PATCH again: it reads the
    object back, finds the frozen body, marks the PATCH succeeded and stores the new
    ETag. One PATCH in the ledger."""
    stack = rig.stack
    await rig.start_worker()
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    await _status(stack, key, "finalized")
    before = await stack.link(key)
    assert before is not None and before["remote_etag"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, nth=1, action="hang_after_effect")
    )
    await stack.pool.execute(
        'UPDATE crm_record SET fields = fields || \'{"Amount": "4242"}\'::jsonb '
        "WHERE source_object = 'Opportunity' AND record_id = 'o-001'"
    )
    decision = await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    assert isinstance(decision, PatchQueued)
    await eventually(
        lambda: stack.sandbox.ledger(object_type="deals", kind="patch"), lambda p: len(p) == 1
    )
    await rig.stop_worker()
    await rig.start_worker()
    patch = await eventually(
        lambda: stack.pool.fetchrow(
            "SELECT * FROM connector_patch_dispatch WHERE link_key = $1", key
        ),
        lambda r: r is not None and r["status"] not in ("pending", "processing"),
        timeout_s=90,
    )
    assert patch["status"] == "succeeded"
    async with stack.pool.acquire() as conn:
        tries = await jq.patch_journal(conn, patch["patch_id"])
    assert len(tries) == 1, "one try: the read-back is a GET, not a journalled send"
    assert len(await stack.sandbox.ledger(object_type="deals", kind="patch")) == 1
    after = await stack.link(key)
    assert after is not None and after["remote_etag"] != before["remote_etag"]


async def test_a_checkpointed_patch_on_a_replay_safe_profile_is_never_resent(
    stack: Stack,
) -> None:
    """P-50, SPEC §15 C-2 (overrides PAT's replay-safe exception). The contacts' profile
    declares patchReplaySafe and no read-back. A worker dies right after a PATCH's
    checkpoint (it may have left). Before, the restarted workflow re-sent it (one PATCH
    in the ledger, `succeeded`). Now it parks ambiguous_remote_effect, nothing sent."""
    key = await _finalized(stack, "c-001")
    await stack.pool.execute(
        'UPDATE crm_record SET fields = fields || \'{"FirstName": "Augusta"}\'::jsonb '
        "WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    await _abandoned_patch(stack, key, _save("c-001"), checkpoint=True)
    await wake_link(stack.client, stack.task_queue, key, None)
    rows = await eventually(
        lambda: _seed_patches(stack, key),
        lambda rs: [r["status"] for r in rs] == ["ambiguous_remote_effect"],
    )
    assert rows[0]["remote_io_started_at"] is not None
    assert await stack.sandbox.ledger(object_type="contacts", kind="patch") == []


# -- P-23: what each answer left in the attempt and the journal --------------------------


@pytest.mark.parametrize(("record_id", "answer"), [("c-001", 201), ("c-002", 422), ("c-003", 409)])
async def test_the_response_snapshot_and_journal_hash_of_each_answer(
    stack: Stack, record_id: str, answer: int
) -> None:
    """P-23 (seed 000 "After POST"; POST-2, JRN-1): after a 201, a 422 and a 409 the
    attempt's `response_snapshot` holds the status, the body hash and the entity tag, and
    the journal's `response_hash` is the same hash. (Before, a 422 or 409 snapshot kept
    only the status.)"""
    if answer != 201:
        await stack.sandbox.add_fault(
            FaultRuleSpec(method="POST", path=CONTACTS, action="status", status=answer, times=1)
        )
    await stack.push(record_id)
    key = contact_key(record_id)
    end = {201: "finalized", 422: "terminal_failed", 409: "ambiguous_remote_effect"}[answer]
    attempt = await _status(stack, key, end)
    snapshot = jsonb(attempt["response_snapshot"])
    [entry] = await _journal(stack, attempt["attempt_id"])
    assert (entry["outcome"], entry["status"]) == ("answered", answer)
    assert snapshot["status"] == answer
    assert snapshot["body_hash"] and snapshot["body_hash"] == entry["response_hash"]
    assert "etag" in snapshot
    if answer == 201:
        link = await stack.link(key)
        assert link is not None and snapshot["etag"] == link["remote_etag"] is not None
        assert snapshot["remote_id"] == attempt["remote_id"]
    else:
        assert snapshot["etag"] is None  # the refusal carried no entity tag


# -- P-55: a save while the attempt waits in writeback_pending changes nothing -------------


async def test_a_save_during_writeback_pending_leaves_attempt_and_mirror_untouched(
    rig: Rig,  # noqa: F811 (the fixture imported above)
) -> None:
    """P-55 (seed 000 "Create Attempt State", writeback_pending; POST-3, LANE-4). A foreign
    value in the mirror field holds the attempt in writeback_pending. Another save is
    observed, and once the workflow has taken it (its mirror retried again) the attempt
    row (status, claim token, retry count, update time) and the record's mirror fields
    are byte-identical; nothing was sent."""
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
    held = await _status(stack, key, "writeback_pending")
    columns = "status, claim_token, retry_count, updated_at, mirror_status, response_snapshot"
    row_sql = f"SELECT {columns} FROM connector_push_attempt WHERE attempt_id = $1"
    mirror_sql = (
        "SELECT fields::text, updated_at FROM crm_record "
        "WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    before = await stack.pool.fetchrow(row_sql, held["attempt_id"])
    record_before = await stack.pool.fetchrow(mirror_sql)
    failures = await _mirror_failures(stack, key)

    decision = await stack.push("c-001")
    assert isinstance(decision, ObservedActiveAttempt)
    # The workflow took the save and the mirror failed once more since.
    await eventually(lambda: _mirror_failures(stack, key), lambda n: n > failures, timeout_s=60)
    assert await stack.pool.fetchrow(row_sql, held["attempt_id"]) == before
    assert await stack.pool.fetchrow(mirror_sql) == record_before
    assert '"remote_id__c": "foreign-9"' in record_before["fields"]
    assert len(await _creates(stack, "contacts")) == 1
    assert await stack.sandbox.ledger(object_type="contacts", kind="patch") == []
    assert hooks.tries == 1


async def _mirror_failures(stack: Stack, key: str) -> int:
    description = await stack.handle(key).describe()
    raw = description.raw_description
    return sum(
        p.attempt - 1 for p in raw.pending_activities if p.activity_type.name == "write_mirror"
    )
