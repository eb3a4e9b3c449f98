"""Issue 10, reproduced end to end: the send journal keeps what a create's try may have done
(SPEC JRN-1, JRN-2, REC-4, PROF-1, PROF-3, PROF-4). (The PATCH side, PROF-2, is in
test_patch_evidence.py.)

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
from protocol.admission import CreateReserved
from protocol.messages import (
    LinkWorkflowInput,
    ReconcileInput,
    SupersedeInput,
)
from protocol.rate_limit import fairness_key_for
from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from tests.e2e.conftest import EXAMPLES, Stack, company_key, contact_key, demo_manifest
from tests.e2e.evidence_support import refusal_chain, status_of
from tests.e2e.rig import SteerableHooks
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow

CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"


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


async def _journal(stack: Stack, attempt_id: object) -> list[asyncpg.Record]:
    async with stack.pool.acquire() as conn:
        return await jq.attempt_journal(conn, str(attempt_id))


# -- problem 1: a try that may have landed is never forgotten -----------------------------


@pytest.mark.slow(seconds=95)
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
    parked = await status_of(stack, key, "ambiguous_remote_effect", EXHAUSTION_S)

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
    await status_of(stack, key, "finalized")
    assert len(await private_client.ledger(object_type="contacts", kind="create")) == 1


# -- problem 3: a declared "not applied" answer is re-sent, not parked ---------------------


async def test_a_429_on_a_plain_profile_is_resent_after_retry_after(stack: Stack) -> None:
    """Profile without idempotency, `notAppliedStatuses: [429]`: the 429 proves the try had
    no effect; the same frozen request goes again after Retry-After; no operator."""
    await stack.push("c-002")
    await status_of(stack, contact_key("c-002"), "finalized")
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="status", status=429, nth=1)
    )
    decision = await stack.push(
        "a-002", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, CreateReserved)
    key = company_key("a-002")
    done = await status_of(stack, key, "finalized")
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


# -- problem 4: one remote object, one link -----------------------------------------------


async def _ambiguous_company(stack: Stack) -> str:
    """a-002 (primary contact c-002, linked first) parked ambiguous by a lost answer."""
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="reset_after_effect", nth=1)
    )
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    key = company_key("a-002")
    await status_of(stack, key, "ambiguous_remote_effect")
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
    return refusal_chain(refused.value)


async def test_reconcile_refuses_a_non_canonical_id(stack: Stack) -> None:
    await stack.push("c-002")
    owned = (await status_of(stack, contact_key("c-002"), "finalized"))["remote_id"]
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
        await status_of(stack, contact_key(contact), "finalized")
    await stack.push("a-001", slot="push-company", obj="Account", dest="remote-companies")
    owned = (await status_of(stack, company_key("a-001"), "finalized"))["remote_id"]
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
    await status_of(stack, key, "finalized")
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
    # either (one baseline, SPEC VER-1).
    assert markers == [], markers
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    single_key = fairness_key_for(given.budget.fairness_key, bulk=False)  # NF-8
    assert scheduled[0].priority.fairness_key == single_key
