"""Seed rows no test proved before issue 15, each end to end against the sandbox remote.

- frozen use (seed "Source Of Truth" rows "Retry body for an existing attempt",
  "Outbound source-value authority"; "Retry And Recovery" 1; SPEC POST-1, PACK-2): the
  bytes on the wire are the frozen request's, whatever changes between the
  reservation and the first POST and between two tries;
- finalizing the link and moving the attempt to `writeback_pending` is one durable
  transition (seed "After POST" 2, SPEC POST-2);
- a row with an unknown `DispatchLane` is never claimed or recovered (seed "Deferred
  Association Dispatch Lane", SPEC LANE-1).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from db.journal import checkpoint_patch
from db.links import lock_link_key
from db.relay import links_with_pending_work
from protocol.admission import CreateReserved, PatchQueued, SaveRequest
from protocol.identity import link_key
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.admission import admit_save
from services.dispatch_hooks import DispatchHooks
from services.patch.claim import claim_queued
from services.record_loader import load_records, parse_records_document
from services.wake import wake_link
from tests.e2e.conftest import OWNER, Stack, contact_key
from tests.e2e.patch_support import Doc, apply_edit, contact_profile, contact_slot, remote_object
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow

Step = Callable[[], Awaitable[None]]


class ChangingHooks(DispatchHooks):
    """Runs the next queued change at each try's checkpoint seam (before its POST)."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.tries = 0

    async def before_checkpoint(self, attempt_id: str) -> None:
        del attempt_id
        self.tries += 1
        if self.steps:
            await self.steps.pop(0)()


@pytest.fixture
def hooks() -> ChangingHooks:
    return ChangingHooks()


# -- frozen use ------------------------------------------------------------------------


async def set_fields(stack: Stack, record_id: str, fields: dict[str, str]) -> None:
    await stack.pool.execute(
        "UPDATE crm_record SET fields = fields || $2::jsonb "
        "WHERE source_object = 'Contact' AND record_id = $1",
        record_id,
        json.dumps(fields),
    )


async def grant_bob_everything(stack: Stack) -> None:
    """Widen bob's grant to Phone (the frozen authority excluded it)."""
    grant = {
        "user": "bob",
        "object": "Contact",
        "records": ["c-001", "c-002", "c-004"],
        "fields": ["FirstName", "LastName", "Email", "Phone"],
    }
    async with stack.pool.acquire() as conn:
        await load_records(conn, parse_records_document({"records": [], "grants": [grant]}))


def remap_and_retune(doc: Doc) -> None:
    """A mapping row changed and the profile's retry policy changed: both frozen-no-effect
    for an attempt (drift matrix), so the create proceeds with its frozen request."""
    contact_slot(doc)["mappings"][1]["remoteProperty"] = "given_name"
    contact_profile(doc)["retryPolicy"] = {"maxAttempts": 7, "initialIntervalMs": 150}


def remap_again(doc: Doc) -> None:
    remap_and_retune(doc)
    contact_slot(doc)["mappings"].append({"sourceField": "Title", "remoteProperty": "jobtitle"})


async def test_the_bytes_on_the_wire_are_the_frozen_request_through_every_change(
    stack: Stack, remote: BackgroundSandbox, hooks: ChangingHooks
) -> None:
    """bob saves c-001 (he cannot read Phone). Before the first POST: the record, bob's
    grant (now Phone too), a mapping row and the profile change; the first POST lands and
    its answer is lost; before the second try they change again. Both tries send the
    frozen bytes (the sandbox hashes the raw body), never a phone, never the new names."""

    async def first() -> None:
        await set_fields(stack, "c-001", {"FirstName": "Changed-1", "Title": "Countess"})
        await grant_bob_everything(stack)
        await apply_edit(stack.pool, remote, remap_and_retune)

    async def second() -> None:
        await set_fields(stack, "c-001", {"FirstName": "Changed-2", "Phone": "+1 000"})
        await apply_edit(stack.pool, remote, remap_again)

    hooks.steps = [first, second]
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path="/crm/v3/objects/contacts", action="reset_after_effect", nth=1
        )
    )
    decision = await stack.push("c-001", user="bob")
    assert isinstance(decision, CreateReserved)
    frozen = decision.reservation.request
    assert isinstance(frozen.body, dict) and isinstance(frozen.body["properties"], dict)
    assert "phone" not in frozen.body["properties"]
    key = contact_key("c-001")
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    assert hooks.tries == 2 and hooks.steps == []
    sent = await stack.sandbox.ledger(object_type="contacts")
    assert len(sent) == 2 and [e.replayed for e in sent] == [False, True]
    assert {e.body_sha256 for e in sent} == {frozen.body_hash}
    stored = json.loads(attempt["request_snapshot"])
    assert stored["body"] == frozen.body and stored["body_hash"] == frozen.body_hash
    obj = await remote_object(remote, "contacts", attempt["remote_id"])
    assert obj["properties"]["firstname"] == "Ada"
    assert not {"phone", "given_name", "jobtitle"} & set(obj["properties"])


def plain_profile_turns_idempotent(doc: Doc) -> None:
    """`sandbox-plain` (companies) now declares an Idempotency-Key for POST: drift the
    matrix calls frozen-no-effect for an active create, so the frozen request is sent."""
    plain = next(p for p in doc["profiles"] if p["name"] == "sandbox-plain")  # type: ignore[union-attr]
    plain["idempotency"] = {"post": {"header": "Idempotency-Key", "keyRetention": "24h"}}


async def test_recovery_reads_the_frozen_profile_not_the_live_one(
    stack: Stack, remote: BackgroundSandbox, hooks: ChangingHooks
) -> None:
    """Seed "Retry And Recovery" (the frozen profile decides what a retry may do; REC-4).
    The company's profile gains an idempotency declaration after its create was frozen
    without one; the POST lands and its answer is lost. The frozen request carries no
    key, so re-sending it would be a second company: recovery must judge it by the frozen
    profile (no idempotency: park ambiguous), not by the live one (replay-safe)."""
    await stack.push("c-002")  # the company's association target: no deferred lane
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )

    async def turn_idempotent() -> None:
        await apply_edit(stack.pool, remote, plain_profile_turns_idempotent)

    hooks.steps = [turn_idempotent]
    await stack.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path="/crm/v3/objects/companies", action="reset_after_effect", nth=1
        )
    )
    decision = await stack.push(
        "a-002", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, CreateReserved), decision
    assert "Idempotency-Key" not in decision.reservation.request.headers
    key = decision.reservation.link_key
    attempt = await eventually(
        lambda: stack.attempt(key), lambda r: r["status"] == "ambiguous_remote_effect"
    )
    assert attempt["remote_io_started_at"] is not None and hooks.steps == []
    creates = await stack.sandbox.ledger(object_type="companies", kind="create")
    assert len(creates) == 1


# -- finalize + writeback_pending: one transaction --------------------------------------

FAIL_LINK_COMMIT = """
CREATE SEQUENCE test_link_commit_failures;
CREATE FUNCTION test_fail_link_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('test_link_commit_failures');
    RAISE EXCEPTION 'injected: the link cannot commit';
END $$;
CREATE CONSTRAINT TRIGGER test_fail_link_commit_tg AFTER INSERT ON connector_remote_link
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_fail_link_commit();
"""


async def test_the_link_and_writeback_pending_commit_together_or_not_at_all(
    stack: Stack,
) -> None:
    """A failure injected at the commit of the transaction that creates the link (a
    deferred trigger): the attempt's move to writeback_pending is rolled back with it, so
    there is never a link without its attempt in writeback_pending, nor the reverse. Once
    the failure is lifted, the replay-safe retry finalizes the one remote object."""
    await stack.pool.execute(FAIL_LINK_COMMIT)
    try:
        await stack.push("c-001")
        key = contact_key("c-001")
        await eventually(
            lambda: stack.pool.fetchval(
                "SELECT last_value FROM test_link_commit_failures WHERE is_called"
            ),
            lambda n: n is not None and n >= 1,
            timeout_s=30,
        )
        assert await stack.link(key) is None
        attempt = await stack.attempt(key)
        assert attempt["status"] in {"processing", "post_sent"}, attempt["status"]
        assert attempt["remote_id"] is None and attempt["response_snapshot"] is None
    finally:
        await stack.pool.execute("DROP TRIGGER test_fail_link_commit_tg ON connector_remote_link")
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    link = await stack.link(key)
    assert link is not None and link["remote_id"] == attempt["remote_id"]
    objects = {e.object_id for e in await stack.sandbox.ledger(object_type="contacts")}
    assert objects == {attempt["remote_id"]}


# -- unknown dispatch lanes -------------------------------------------------------------


@pytest.mark.parametrize("status", ["pending", "processing"])
async def test_a_row_in_an_unknown_lane_is_never_claimed_or_recovered(
    stack: Stack, status: str
) -> None:
    """LANE-1: an attempt in lane `lane_from_the_future`, `pending` or `processing` with an
    expired claim and no checkpoint, is left exactly as it is by the workflow and the
    relay; the workflow's view names the lane, nothing reaches the remote."""
    key = contact_key("c-001")
    # Admit without waking (as if Temporal were down), then move the row to a lane this
    # runtime does not know, as a newer runtime would have written it.
    save = SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id="push-contact",
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id="c-001",
        originating_user_id="alice",
    )
    decision = await admit_save(
        stack.pool, save, idempotency_key="k-lane", locator_value="cp-k-lane", now=datetime.now(UTC)
    )
    assert isinstance(decision, CreateReserved)
    claimed = status == "processing"
    await stack.pool.execute(
        "UPDATE connector_push_attempt SET dispatch_lane = 'lane_from_the_future', "
        "status = $2, claim_token = CASE WHEN $3 THEN gen_random_uuid() END, "
        "claimed_at = CASE WHEN $3 THEN now() - interval '1 hour' END, "
        "claim_expires_at = CASE WHEN $3 THEN now() - interval '30 minutes' END "
        "WHERE link_key = $1",
        key,
        status,
        claimed,
    )
    before = dict(await stack.attempt(key))
    async with stack.pool.acquire() as conn:
        swept = await links_with_pending_work(conn, None, 100, timedelta(0))
    assert key not in swept  # the relay never wakes it
    stack.touched.add(key)
    await wake_link(stack.client, stack.task_queue, key, None)
    view = await eventually(
        lambda: stack.handle(key).query(LinkWorkflow.state), lambda v: v.loaded, timeout_s=30
    )
    assert view.dispatch_lane == "lane_from_the_future" and view.attempt_status == status
    assert dict(await stack.attempt(key)) == before  # not claimed, recovered or normalised
    assert await stack.sandbox.ledger(object_type="contacts") == []
    journal = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_send_journal WHERE attempt_id = $1", before["attempt_id"]
    )
    assert journal == 0


# -- PATCH claim recovery ---------------------------------------------------------------


async def _finalized(stack: Stack, record_id: str, **where: str) -> str:
    await stack.push(record_id, **where)
    slot = where.get("slot", "push-contact")
    key = link_key(OWNER, slot, where.get("obj", "Contact"), record_id,
                   where.get("dest", "remote-contacts"))  # fmt: skip
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    return key


async def _abandoned_patch(stack: Stack, key: str, save: SaveRequest, *, checkpoint: bool) -> None:
    """Admit a save (a PATCH queued, nobody woken), then run a worker's real planning step
    (claim, gate, freeze the body) and, with `checkpoint`, its RemoteIOStartedAt checkpoint,
    and go no further: what a worker killed at that point leaves behind."""
    decision = await admit_save(
        stack.pool, save, idempotency_key="unused", locator_value="unused", now=datetime.now(UTC)
    )
    assert isinstance(decision, PatchQueued), decision
    async with stack.pool.acquire() as conn, conn.transaction():
        await lock_link_key(conn, key)
        plan = await claim_queued(conn, key)
    assert plan is not None and plan.journal_id is None
    if checkpoint:
        async with stack.pool.acquire() as conn:
            assert await checkpoint_patch(conn, plan.patch_id, plan.token) is not None


def _save(record_id: str, **where: str) -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=where.get("slot", "push-contact"),
        destination_slot_id=where.get("dest", "remote-contacts"),
        source_object=where.get("obj", "Contact"),
        source_record_id=record_id,
        originating_user_id="alice",
    )


async def _patches(stack: Stack, key: str) -> list[asyncpg.Record]:
    return await stack.pool.fetch(
        "SELECT status, retry_count, remote_io_started_at FROM connector_patch_dispatch "
        "WHERE link_key = $1 ORDER BY created_at",
        key,
    )


async def test_a_patch_claim_lost_before_its_checkpoint_returns_to_pending_and_sends_once(
    stack: Stack,
) -> None:
    """Seed "Deferred Association Dispatch Lane" (PATCH recovery) / SPEC §4 PAT: a
    `processing` PATCH whose worker died before its checkpoint goes back to `pending` with
    its retry count advanced, and the restarted workflow sends it exactly once."""
    key = await _finalized(stack, "c-001")
    await set_fields(stack, "c-001", {"FirstName": "Augusta"})
    await _abandoned_patch(stack, key, _save("c-001"), checkpoint=False)
    [lost] = await _patches(stack, key)
    assert lost["status"] == "processing" and lost["remote_io_started_at"] is None
    await wake_link(stack.client, stack.task_queue, key, None)
    rows = await eventually(
        lambda: _patches(stack, key), lambda rs: [r["status"] for r in rs] == ["succeeded"]
    )
    assert rows[0]["retry_count"] == 1
    assert len(await stack.sandbox.ledger(object_type="contacts", kind="patch")) == 1


async def test_a_patch_checkpointed_on_a_non_replay_safe_profile_parks_ambiguous_unsent(
    stack: Stack,
) -> None:
    """After its checkpoint the PATCH may have left: on a profile that does not declare
    PATCH replay-safe (the companies' `sandbox-plain`) the restarted workflow parks it
    `ambiguous_remote_effect` and never re-sends it (SPEC §4 PAT, REC-4)."""
    await _finalized(stack, "c-002")
    company = {"slot": "push-company", "obj": "Account", "dest": "remote-companies"}
    key = await _finalized(stack, "a-002", **company)
    await _abandoned_patch(stack, key, _save("a-002", **company), checkpoint=True)
    await wake_link(stack.client, stack.task_queue, key, None)
    rows = await eventually(
        lambda: _patches(stack, key),
        lambda rs: [r["status"] for r in rs] == ["ambiguous_remote_effect"],
    )
    assert rows[0]["remote_io_started_at"] is not None
    assert await stack.sandbox.ledger(object_type="companies", kind="patch") == []
