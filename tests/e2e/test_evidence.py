"""Issue 10, reproduced end to end: the send journal keeps what a try may have done
(SPEC JRN-1, JRN-2, REC-4, PROF-1, PROF-2, PROF-4).

Real Postgres, a real Temporal server and the sandbox over HTTP. Each test is
one of the faults an outsider used to break the guarantee, now ending as the
issue specifies.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest
import yaml
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError

from db import journal as jq
from protocol.admission import CreateReserved, PatchQueued
from protocol.messages import (
    LinkWorkflowInput,
    ReconcileInput,
    RevalidateInput,
    SupersedeInput,
)
from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from tests.e2e.conftest import EXAMPLES, Stack, company_key, contact_key, deal_key, demo_manifest
from tests.e2e.rig import SteerableHooks
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow

CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"
DEALS = "/crm/v3/objects/deals/*"
# The workflow's create retry budget (8 tries, 1 s doubling to 30 s) is ~91 s.
EXHAUSTION_S = 150.0


@pytest.fixture
def hooks() -> SteerableHooks:
    return SteerableHooks()


@dataclass
class PrivateRemote:
    """A sandbox this test may stop and restart on the same port (its state persists)."""

    config: SandboxConfig
    port: int
    server: BackgroundSandbox | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = BackgroundSandbox(self.config, port=self.port).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def private_remote(tmp_path: Path) -> Iterator[PrivateRemote]:
    base = SandboxConfig.model_validate(yaml.safe_load((EXAMPLES / "sandbox.yaml").read_text()))
    config = base.model_copy(update={"persist_path": tmp_path / "sandbox.json"})
    first = BackgroundSandbox(config).start()
    remote = PrivateRemote(config, first.port, first)
    try:
        yield remote
    finally:
        remote.stop()


@pytest.fixture
async def private_client(private_remote: PrivateRemote) -> AsyncIterator[SandboxClient]:
    async with httpx.AsyncClient(base_url=private_remote.url, timeout=10.0) as http:
        yield SandboxClient(private_remote.url, http)


async def _status(stack: Stack, key: str, status: str, timeout_s: float = 30.0) -> asyncpg.Record:
    return await eventually(lambda: stack.attempt(key), lambda r: r["status"] == status, timeout_s)


def _refusal(error: BaseException) -> str:
    """The whole cause chain of a refused update (update -> activity -> application)."""
    parts = []
    node: BaseException | None = error
    while node is not None:
        parts.append(str(node))
        node = node.__cause__ or getattr(node, "cause", None)
    return " | ".join(parts)


async def _journal(stack: Stack, attempt_id: object) -> list[asyncpg.Record]:
    async with stack.pool.acquire() as conn:
        return await jq.attempt_journal(conn, str(attempt_id))


# -- problem 1: a try that may have landed is never forgotten -----------------------------


@pytest.mark.timeout(300)
async def test_exhaustion_after_a_landed_try_parks_ambiguous_and_supersede_is_refused(
    stack: Stack,
    hooks: SteerableHooks,
    private_remote: PrivateRemote,
    private_client: SandboxClient,
) -> None:
    """Idempotency-Key profile. Try 1 lands and its connection resets; the remote is then
    down (connection refused) for the whole retry budget. Before: the checkpoint was
    cleared, exhaustion wrote terminal_failed "not_sent" and supersede POSTed a second
    object. Now: ambiguous, supersede refused, one object, reconcile finalizes."""
    async with stack.pool.acquire() as conn:
        await apply_pack(conn, demo_manifest(private_remote.url))

    async def remote_down_from_try_2(attempt_id: str) -> None:
        if hooks.tries == 2:
            await asyncio.to_thread(private_remote.stop)

    hooks.before = remote_down_from_try_2
    await private_client.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="reset_after_effect", nth=1)
    )
    assert isinstance(await stack.push("c-001"), CreateReserved)
    key = contact_key("c-001")
    parked = await _status(stack, key, "ambiguous_remote_effect", EXHAUSTION_S)

    assert "not sent" not in parked["last_error"] and "not_sent" not in parked["last_error"]
    assert "may have landed" in parked["last_error"]
    journal = await _journal(stack, parked["attempt_id"])
    assert [r["outcome"] for r in journal][:2] == ["no_answer", "not_sent"]
    assert all(r["outcome"] == "not_sent" for r in journal[1:]) and len(journal) >= 3
    view = await eventually(
        lambda: stack.handle(key).query(LinkWorkflow.state), lambda v: v.needs_operator
    )
    assert view.attempt_tries_may_have_landed == 1

    private_remote.start()
    with pytest.raises(WorkflowUpdateFailedError):
        await stack.handle(key).execute_update(
            LinkWorkflow.supersede,
            SupersedeInput(operator="ops", reason="looks failed", reserve_next=True),
        )
    creates = await private_client.ledger(object_type="contacts", kind="create")
    assert len(creates) == 1, "one local record, one remote object"
    [created] = creates
    assert created.object_id is not None
    result = await stack.handle(key).execute_update(
        LinkWorkflow.reconcile,
        ReconcileInput(
            operator="ops", reason="ledger", remote_id=created.object_id, evidence="ledger"
        ),
    )
    assert result.accepted
    await _status(stack, key, "finalized")
    assert len(await private_client.ledger(object_type="contacts", kind="create")) == 1


# -- problem 3: a declared "not applied" answer is re-sent, not parked ---------------------


async def test_a_429_on_a_plain_profile_is_resent_after_retry_after(stack: Stack) -> None:
    """Profile without idempotency, `notAppliedStatuses: [429]`: the 429 proves the try had
    no effect; the same frozen request goes again after Retry-After; no operator."""
    await stack.push("c-002")
    await _status(stack, contact_key("c-002"), "finalized")
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="status", status=429, nth=1)
    )
    decision = await stack.push(
        "a-002", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, CreateReserved)
    key = company_key("a-002")
    done = await _status(stack, key, "finalized")
    journal = await _journal(stack, done["attempt_id"])
    assert [(r["outcome"], r["status"]) for r in journal] == [("answered", 429), ("answered", 201)]
    assert len(await stack.sandbox.ledger(object_type="companies", kind="create")) == 1
    parked = [
        wf.id
        async for wf in stack.client.list_workflows(
            f'NeedsOperator = true AND ExecutionStatus = "Running" AND LinkKey = "{key}"'
        )
    ]
    assert parked == []


# -- problem 2: our own landed PATCH is not a remote conflict -----------------------------


async def _finalized_deal(stack: Stack) -> asyncpg.Record:
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    key = deal_key("o-001")
    await _status(stack, key, "finalized")
    link = await stack.link(key)
    assert link is not None and link["remote_etag"]
    return link


async def _save_deal_amount(stack: Stack, amount: str) -> None:
    await stack.pool.execute(
        "UPDATE crm_record SET fields = fields || jsonb_build_object('Amount', $1::text) "
        "WHERE source_object = 'Opportunity' AND record_id = 'o-001'",
        amount,
    )
    decision = await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    assert isinstance(decision, PatchQueued)


async def _patches(stack: Stack, key: str) -> list[asyncpg.Record]:
    return await stack.pool.fetch(
        "SELECT * FROM connector_patch_dispatch WHERE link_key = $1 ORDER BY created_at", key
    )


async def _settled(stack: Stack, key: str, count: int) -> list[asyncpg.Record]:
    def done(rows: list[asyncpg.Record]) -> bool:
        finished = [r for r in rows if r["status"] not in ("pending", "processing")]
        return len(finished) >= count

    return await eventually(lambda: _patches(stack, key), done, timeout_s=60)


async def test_a_landed_patch_whose_answer_is_lost_is_proved_applied_by_read_back(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """P-50, SPEC §15 C-2: patchReplaySafe + If-Match + readback. The PATCH lands, its
    answer is lost. Before, it was re-sent (with the stale ETag, answered 412, then read
    back). Now it is never sent again: a GET reads the object back, finds our values:
    applied, new ETag stored, no suspension, one PATCH in the ledger; the next save
    PATCHes cleanly."""
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="hang_after_effect", nth=1)
    )
    await _save_deal_amount(stack, "100")
    [patch] = await _settled(stack, key, 1)
    assert patch["status"] == "succeeded"
    current = await stack.link(key)
    assert current is not None and current["status"] == "finalized"
    async with httpx.AsyncClient(base_url=remote.url) as http:
        read = await http.get(f"/crm/v3/objects/deals/{link['remote_id']}")
    assert current["remote_etag"] == read.headers["etag"] != link["remote_etag"]
    async with stack.pool.acquire() as conn:
        tries = await jq.patch_journal(conn, patch["patch_id"])
    assert [(r["outcome"], r["status"]) for r in tries] == [("no_answer", None)]
    assert len(await stack.sandbox.ledger(object_type="deals", kind="patch")) == 1

    await _save_deal_amount(stack, "200")
    rows = await _settled(stack, key, 2)
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]
    patches = await stack.sandbox.ledger(object_type="deals", kind="patch")
    assert [p.status for p in patches][-1] == 200


async def test_a_real_out_of_band_change_still_suspends_and_revalidate_refreshes_the_etag(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """The same lost answer, but someone changed the object before our read-back: it
    differs, so the PATCH ends ambiguous (never re-sent, C-2) and the link stays
    finalized. The next save's PATCH carries the stale ETag, gets 412, and the read-back
    shows neither its body nor the ambiguous one: the link is suspended
    `remote_conflict`. `revalidate` then reads the ETag back and the next save PATCHes
    without another 412."""
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="hang_after_effect", nth=1)
    )
    await _save_deal_amount(stack, "100")
    await eventually(
        lambda: stack.sandbox.ledger(object_type="deals", kind="patch"), lambda p: len(p) == 1
    )
    async with httpx.AsyncClient(base_url=remote.url) as http:
        await http.patch(
            f"/crm/v3/objects/deals/{link['remote_id']}",
            json={"properties": {"amount": "999"}},
        )
    [first] = await _settled(stack, key, 1)
    assert first["status"] == "ambiguous_remote_effect"
    assert "read-back differs" in first["last_error"]
    assert len(await stack.sandbox.ledger(object_type="deals", kind="patch")) == 2  # ours + theirs
    await _save_deal_amount(stack, "150")
    suspended = await eventually(
        lambda: stack.link(key), lambda r: r is not None and r["status"] == "suspended_drift", 60
    )
    assert suspended is not None and suspended["suspend_reason"] == "remote_conflict"

    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    result = await handle.execute_update(
        LinkWorkflow.revalidate, RevalidateInput(operator="ops", reason="their change is right")
    )
    assert "entity tag" in result.message
    async with httpx.AsyncClient(base_url=remote.url) as http:
        read = await http.get(f"/crm/v3/objects/deals/{link['remote_id']}")
    refreshed = await stack.link(key)
    assert refreshed is not None and refreshed["remote_etag"] == read.headers["etag"]
    await _save_deal_amount(stack, "300")
    rows = await _settled(stack, key, 3)
    assert [r["status"] for r in rows] == ["ambiguous_remote_effect", "failed", "succeeded"]


async def test_revalidate_is_refused_for_a_deleted_remote_object(stack: Stack) -> None:
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="status", status=404)
    )
    await _save_deal_amount(stack, "5")
    suspended = await eventually(
        lambda: stack.link(key), lambda r: r is not None and r["status"] == "suspended_drift"
    )
    assert suspended is not None and suspended["suspend_reason"] == "remote_deleted"
    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            LinkWorkflow.revalidate, RevalidateInput(operator="ops", reason="try anyway")
        )
    assert "retire" in _refusal(refused.value)
    row = await stack.link(key)
    assert row is not None and row["status"] == "suspended_drift"


# -- problem 4: one remote object, one link -----------------------------------------------


async def _ambiguous_company(stack: Stack) -> str:
    """a-002 (primary contact c-002, linked first) parked ambiguous by a lost answer."""
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="reset_after_effect", nth=1)
    )
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    key = company_key("a-002")
    await _status(stack, key, "ambiguous_remote_effect")
    await eventually(
        lambda: stack.handle(key).query(LinkWorkflow.state), lambda v: v.needs_operator
    )
    return key


async def _refused_reconcile(stack: Stack, key: str, remote_id: str) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await stack.handle(key).execute_update(
            LinkWorkflow.reconcile,
            ReconcileInput(operator="ops", reason="r", remote_id=remote_id, evidence="e"),
        )
    return _refusal(refused.value)


async def test_reconcile_refuses_a_non_canonical_id(stack: Stack) -> None:
    await stack.push("c-002")
    owned = (await _status(stack, contact_key("c-002"), "finalized"))["remote_id"]
    key = await _ambiguous_company(stack)
    for bad in (f" {owned}", f"{owned}\n", f"{owned}\u200b"):
        message = await _refused_reconcile(stack, key, bad)
        assert "not reconciled" in message and "nothing changed" in message, message
    attempt = await stack.attempt(key)
    assert attempt["status"] == "ambiguous_remote_effect" and attempt["remote_id"] is None


async def test_reconcile_to_an_id_another_link_owns_names_it(stack: Stack) -> None:
    """ID-4 is per destination: a company reconciled to the id another company link owns
    (as given, or with a space in front) is refused, and the refusal names that link."""
    for contact in ("c-001", "c-002"):  # the companies' primary contacts (LANE-2)
        await stack.push(contact)
        await _status(stack, contact_key(contact), "finalized")
    await stack.push("a-001", slot="push-company", obj="Account", dest="remote-companies")
    owned = (await _status(stack, company_key("a-001"), "finalized"))["remote_id"]
    key = await _ambiguous_company(stack)
    for candidate in (owned, f" {owned}"):
        assert company_key("a-001") in await _refused_reconcile(stack, key, candidate)
    attempt = await stack.attempt(key)
    assert attempt["status"] == "ambiguous_remote_effect"


# -- PROF-3 without a Postgres round trip per run ---------------------------------------


async def test_the_crm_entry_starts_the_workflow_already_paced(stack: Stack) -> None:
    """The demo pack limits its credential (rateLimit): the CRM entry computes the
    reservation's budget from cached rates and passes it in the start input, so the run
    needs no budget look-up (no extra transaction per create, bench P2)."""
    await stack.push("c-001")
    key = contact_key("c-001")
    await _status(stack, key, "finalized")
    events = [e async for e in stack.handle(key).fetch_history_events()]
    started = events[0].workflow_execution_started_event_attributes
    [payload] = started.input.payloads
    given = LinkWorkflowInput.model_validate_json(payload.data)
    assert given.budget is not None and (given.budget.fairness_key or "").startswith("rb1_")
    markers = [
        e.marker_recorded_event_attributes.marker_name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    # No local budget look-up (a local-activity marker) in this run, and no patch marker
    # either: it is born with its changes (`protocol.link_versions`).
    assert markers == [], markers
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled[0].priority.fairness_key == given.budget.fairness_key


async def test_a_412_caused_by_our_own_earlier_ambiguous_patch_is_not_a_conflict(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """Found by `make chaos`: a PATCH that may have landed ends ambiguous (its read-back
    was inconclusive: the GET answered 503), so the stored ETag is stale; the next save's
    PATCH gets 412. The read-back shows the earlier PATCH's values: the tag moved because
    of us, so it is stored and the new PATCH is sent again (200; its 412 proved it had no
    effect), instead of suspending `remote_conflict`."""
    document = demo_manifest(remote.url)
    for profile in document["profiles"]:  # type: ignore[union-attr]
        if profile["name"] == "sandbox-locator":
            profile["idempotency"] = {"patchReplaySafe": False}
    async with stack.pool.acquire() as conn:
        await apply_pack(conn, document)
    link = await _finalized_deal(stack)
    key = link["link_key"]
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="PATCH", path=DEALS, action="hang_after_effect", nth=1)
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="GET", path=DEALS, action="status", status=503, nth=1)
    )
    await _save_deal_amount(stack, "100")
    [first] = await _settled(stack, key, 1)
    assert first["status"] == "ambiguous_remote_effect"
    assert "read-back inconclusive" in first["last_error"]
    await _save_deal_amount(stack, "200")
    rows = await _settled(stack, key, 2)
    assert [r["status"] for r in rows] == ["ambiguous_remote_effect", "succeeded"]
    current = await stack.link(key)
    assert current is not None and current["status"] == "finalized"
    async with httpx.AsyncClient(base_url=remote.url) as http:
        obj = (await http.get(f"/crm/v3/objects/deals/{link['remote_id']}")).json()
    assert obj["properties"]["amount"] == "200"
    statuses = [p.status for p in await stack.sandbox.ledger(object_type="deals", kind="patch")]
    assert statuses[-1] == 200
