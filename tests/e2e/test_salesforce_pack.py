"""examples/salesforce.yaml against the sandbox's salesforce mode (issue 52; SPEC PROF-1,
PROF-5, POST-4, PATCH-3, REC-1, P-01): the remote's answers are the pack's declarations,
not the runtime's. A create answered 201 {id}; an update answered 204 with no body; a lost
create answer recovered by the locator in an external-id field (404: re-sent; 300: parked);
403 REQUEST_LIMIT_EXCEEDED declared not applied and the daily limit, so the budget waits a
rolling window; 400 UNABLE_TO_LOCK_ROW declared not applied, so the same request goes again.

Real Postgres, Temporal and the sandbox over HTTP on 127.0.0.1; the worker's quota clock
is moved instead of waiting a day, as in test_daily_quota.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from temporalio.client import Client
from temporalio.service import RPCError

from protocol.admission import AdmissionDecision, PatchQueued, SaveRequest
from protocol.identity import link_key
from protocol.messages import LinkView
from sandbox.client import SandboxClient
from sandbox.config import ObjectTypeConfig, SalesforceLimits, SandboxConfig
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.daily_quota import forget_quotas
from services.dispatch_hooks import DispatchHooks
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from tests.e2e.patch_support import set_field
from tests.e2e.support import eventually
from worker.crm import report_save, workflow_id
from worker.runtime import build_worker, remote_http_client
from workflows.link import LinkWorkflow

PACK = Path(__file__).resolve().parents[2] / "examples" / "salesforce.yaml"
OWNER, SLOT, DEST, OBJECT = "crm-owner", "sf-contact", "sf-contacts", "Contact"
LOCATOR = "Connector_Push_Locator__c"
SOBJECTS = "/services/data/v59.0/sobjects"
FIELDS = ["FirstName", "LastName", "Email", "Phone", "remote_id__c", "remote_provenance__c"]


class QuotaClock(DispatchHooks):
    """The worker's clock, moved by the test; waiting runs look again often."""

    quota_recheck_s = 0.3

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


@pytest.fixture(scope="module")
def sf_remote() -> Iterator[BackgroundSandbox]:
    """The sandbox in its salesforce mode: contacts with a unique external-id locator."""
    types = {OBJECT: ObjectTypeConfig(unique_properties=(LOCATOR,))}
    with BackgroundSandbox(SandboxConfig(mode="salesforce", object_types=types)) as server:
        yield server


@dataclass
class SfStack:
    pool: asyncpg.Pool
    client: Client
    task_queue: str
    sandbox: SandboxClient
    hooks: QuotaClock

    async def push(self, record_id: str) -> AdmissionDecision:
        save = SaveRequest(
            connector_owner_key=OWNER,
            action_slot_id=SLOT,
            destination_slot_id=DEST,
            source_object=OBJECT,
            source_record_id=record_id,
            originating_user_id="alice",
        )
        return await report_save(self.pool, self.client, self.task_queue, save)

    async def status(self, record_id: str) -> str | None:
        row = await self.pool.fetchrow(
            "SELECT status FROM connector_push_attempt WHERE link_key = $1 "
            "ORDER BY attempt_ordinal DESC LIMIT 1",
            key(record_id),
        )
        return None if row is None else str(row["status"])

    async def view(self, record_id: str) -> LinkView:
        handle = self.client.get_workflow_handle(workflow_id(key(record_id)))
        view: LinkView = await handle.query(LinkWorkflow.state)
        return view


def key(record_id: str) -> str:
    return link_key(OWNER, SLOT, OBJECT, record_id, DEST)


async def _load(pool: asyncpg.Pool, base_url: str, ids: list[str]) -> None:
    manifest: dict[str, Any] = yaml.safe_load(PACK.read_text())
    manifest["profiles"][0]["baseUrl"] = base_url
    records = [
        {"object": OBJECT, "id": r, "fields": {"LastName": r, "Email": f"{r}@sf.test"}} for r in ids
    ]
    grants = [{"user": "alice", "object": OBJECT, "records": "*", "fields": FIELDS}]
    doc = parse_records_document({"owner": OWNER, "records": records, "grants": grants})
    async with pool.acquire() as conn:
        await apply_pack(conn, manifest)
        await load_records(conn, doc)
    forget_quotas()


IDS = [f"sf-{i:02}" for i in range(4)]


@pytest.fixture
async def sf(
    db_pool: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    sf_remote: BackgroundSandbox,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[SfStack]:
    # The credential the pack names (`env:SALESFORCE_TOKEN`), bound to the sandbox (S-3).
    monkeypatch.setenv("CONNECTOR_PUSH_CREDENTIAL_ENV_SALESFORCE_TOKEN", "sf-session-token")
    port = httpx.URL(sf_remote.url).port
    monkeypatch.setenv("CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_SALESFORCE_TOKEN", f"127.0.0.1:{port}")
    await _load(db_pool, sf_remote.url, IDS)
    hooks = QuotaClock()
    async with (
        httpx.AsyncClient(base_url=sf_remote.url, timeout=10.0) as http,
        remote_http_client() as remote_http,
    ):
        sandbox = SandboxClient(sf_remote.url, http)
        await sandbox.reset()
        await sandbox.set_limits(SalesforceLimits())
        worker = build_worker(temporal_client, db_pool, remote_http, task_queue, hooks=hooks)
        async with worker:
            yield SfStack(db_pool, temporal_client, task_queue, sandbox, hooks)
            for record_id in IDS:
                with contextlib.suppress(RPCError):
                    handle = temporal_client.get_workflow_handle(workflow_id(key(record_id)))
                    await handle.terminate("test finished")


async def _finalized(sf: SfStack, record_id: str, timeout_s: float = 15.0) -> str:
    await eventually(lambda: sf.status(record_id), lambda s: s == "finalized", timeout_s)
    link = await sf.pool.fetchrow(
        "SELECT remote_id FROM connector_remote_link WHERE link_key = $1", key(record_id)
    )
    assert link is not None
    return str(link["remote_id"])


async def _remote_contacts(sf: SfStack) -> list[dict[str, Any]]:
    return await sf.sandbox.objects(OBJECT)


async def test_a_create_answered_201_and_an_update_answered_204_with_no_body(
    sf: SfStack,
) -> None:
    await sf.push("sf-00")
    remote_id = await _finalized(sf, "sf-00")
    [created] = await sf.sandbox.ledger(OBJECT, "create")
    assert (created.status, created.object_id) == (201, remote_id) and len(remote_id) == 18

    await set_field(sf.pool, OBJECT, "sf-00", "FirstName", "Augusta")
    assert isinstance(await sf.push("sf-00"), PatchQueued)
    rows = await eventually(
        lambda: sf.pool.fetch(
            "SELECT status FROM connector_patch_dispatch WHERE link_key = $1", key("sf-00")
        ),
        lambda r: bool(r) and r[0]["status"] != "pending" and r[0]["status"] != "processing",
        15.0,
    )
    assert [r["status"] for r in rows] == ["succeeded"]
    [patch] = await sf.sandbox.ledger(OBJECT, "patch")
    assert (patch.object_id, patch.status) == (remote_id, 204)
    [record] = await _remote_contacts(sf)
    assert record["FirstName"] == "Augusta"


async def test_a_lost_create_answer_is_found_by_its_external_id_locator(sf: SfStack) -> None:
    """The create landed but its answer was lost: the look-up by the locator's external-id
    field finds the record (`Id`), so the link finalizes on it and nothing is created twice."""
    await sf.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=f"{SOBJECTS}/{OBJECT}/", action="reset_after_effect")
    )
    await sf.push("sf-01")
    remote_id = await _finalized(sf, "sf-01")

    [record] = await _remote_contacts(sf)
    assert record["Id"] == remote_id and record[LOCATOR]
    lookups = await sf.sandbox.ledger(OBJECT)
    assert [e.kind for e in lookups].count("create") == 1


async def test_a_locator_answered_404_proves_no_record_so_the_create_is_sent_again(
    sf: SfStack,
) -> None:
    await sf.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=f"{SOBJECTS}/{OBJECT}/", action="reset_before_effect", times=1
        )
    )
    await sf.push("sf-02")
    remote_id = await _finalized(sf, "sf-02")

    assert [r["Id"] for r in await _remote_contacts(sf)] == [remote_id]
    journal = await sf.pool.fetch(
        "SELECT outcome, status FROM connector_send_journal ORDER BY journal_id"
    )
    # The lost try, the look-up that proved it had no effect, the re-sent create.
    assert [(j["outcome"], j["status"]) for j in journal] == [
        ("no_answer", None),
        ("answered", 404),
        ("answered", 201),
    ]


async def test_a_locator_answered_300_is_not_unique_and_parks_for_an_operator(
    sf: SfStack,
) -> None:
    await sf.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=f"{SOBJECTS}/{OBJECT}/", action="reset_after_effect")
    )
    await sf.sandbox.add_fault(
        FaultRuleSpec(
            method="GET",
            path=f"{SOBJECTS}/{OBJECT}/{LOCATOR}/*",
            action="status",
            status=300,
            body=[f"{SOBJECTS}/{OBJECT}/a", f"{SOBJECTS}/{OBJECT}/b"],
        )
    )
    await sf.push("sf-03")
    await eventually(lambda: sf.status("sf-03"), lambda s: s == "ambiguous_remote_effect", 15.0)
    assert len(await _remote_contacts(sf)) == 1  # created once, never re-sent blind


async def test_request_limit_exceeded_is_the_declared_daily_limit_and_the_budget_waits(
    sf: SfStack,
) -> None:
    """403 REQUEST_LIMIT_EXCEEDED: not applied (PROF-1) and the daily limit (PROF-5): the
    budget waits the declared rolling 24 hours, not parked, then the same request goes."""
    await sf.sandbox.set_limits(SalesforceLimits(allocation=1))
    await sf.push("sf-00")
    await _finalized(sf, "sf-00")
    before = sf.hooks.now()
    await sf.push("sf-01")
    view = await eventually(
        lambda: sf.view("sf-01"), lambda v: v.quota_wait_until is not None, 15.0
    )
    after = sf.hooks.now()
    assert view.quota_wait_until is not None and not view.needs_operator
    day = timedelta(hours=24)
    assert before + day <= view.quota_wait_until <= after + day
    refusals = await sf.pool.fetch(
        "SELECT status FROM connector_send_journal WHERE daily_refusal ORDER BY journal_id"
    )
    assert [r["status"] for r in refusals] == [403]
    assert await sf.status("sf-01") == "processing"

    # The window rolls past: the remote's allocation frees, and so does the budget.
    await sf.sandbox.advance_clock(86_400 + 2)
    sf.hooks.offset = day + timedelta(seconds=2)
    await _finalized(sf, "sf-01")
    assert len(await _remote_contacts(sf)) == 2


async def test_unable_to_lock_row_is_not_applied_and_the_same_request_goes_again(
    sf: SfStack,
) -> None:
    await sf.sandbox.set_locked(True)
    await sf.push("sf-02")
    await eventually(
        lambda: sf.pool.fetch("SELECT status FROM connector_send_journal WHERE status = 400"),
        lambda rows: len(rows) >= 1,
        15.0,
    )
    assert await sf.status("sf-02") == "processing"  # waiting to re-send, not terminal
    await sf.sandbox.set_locked(False)
    remote_id = await _finalized(sf, "sf-02")

    assert [r["Id"] for r in await _remote_contacts(sf)] == [remote_id]
    bodies = await sf.pool.fetch(
        "SELECT DISTINCT claim_token FROM connector_send_journal WHERE attempt_id IS NOT NULL"
    )
    assert bodies  # every try was of the one attempt's frozen request
    assert await sf.pool.fetchval("SELECT count(*) FROM connector_push_attempt") == 1
