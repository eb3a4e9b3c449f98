"""The demo pack's core e2e scenarios, parametrized over two remotes (issue 51 item 2):
the demo pack on the generous sandbox, and examples/hubspot.yaml on the HubSpot-exact
mode (no idempotency key, no ETag, a bearer token, the strict limiter). SPEC WF-2,
POST-1..4, REC-1 (locator recovery), PAT, PROF-1 (a 429 applies nothing).

Time budget: the file runs in under 60 s (about 3 s a test on an idle machine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import httpx
import pytest
from temporalio.client import Client

from protocol.admission import CreateReserved, PatchQueued
from protocol.identity import link_key
from sandbox.client import SandboxClient
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.dispatch_hooks import DispatchHooks
from services.packs import apply_pack
from services.record_loader import load_records
from tests.e2e.conftest import OWNER, Stack, _demo_records, demo_manifest
from tests.e2e.hubspot_support import hubspot_manifest, set_credential
from tests.e2e.hubspot_support import hubspot_remote as hubspot_remote  # the fixture
from tests.e2e.patch_support import set_field, settled
from tests.e2e.support import eventually
from worker.runtime import build_worker, remote_http_client, tls_context

CONTACTS = "/crm/v3/objects/contacts"


@dataclass(frozen=True)
class Remote:
    name: str
    contacts: str  # the pack's destination slot for contacts
    stack: Stack

    def key(self, record_id: str) -> str:
        return link_key(OWNER, "push-contact", "Contact", record_id, self.contacts)

    async def push(self, record_id: str) -> object:
        return await self.stack.push(record_id, dest=self.contacts)

    async def finalized(self, record_id: str) -> asyncpg.Record:
        return await eventually(
            lambda: self.stack.attempt(self.key(record_id)), lambda r: r["status"] == "finalized"
        )


@pytest.fixture(params=["demo", "hubspot"])
async def remote_under_test(
    request: pytest.FixtureRequest,
    db_pool: asyncpg.Pool,
    remote: BackgroundSandbox,
    hubspot_remote: BackgroundSandbox,
    temporal_client: Client,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Remote]:
    hubspot = request.param == "hubspot"
    server = hubspot_remote if hubspot else remote
    manifest = hubspot_manifest(server.url) if hubspot else demo_manifest(server.url)
    if hubspot:
        set_credential(monkeypatch, server.url)
    async with db_pool.acquire() as conn:
        await apply_pack(conn, manifest)
        await load_records(conn, _demo_records())
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=10.0, verify=tls_context()) as admin,
        remote_http_client() as http,
    ):
        sandbox = SandboxClient(server.url, admin)
        await sandbox.reset()
        async with build_worker(temporal_client, db_pool, http, task_queue, hooks=DispatchHooks()):
            stack = Stack(db_pool, temporal_client, task_queue, sandbox)
            try:
                yield Remote(
                    request.param, "hubspot-contacts" if hubspot else "remote-contacts", stack
                )
            finally:
                await stack.close()


async def test_create_finalizes_once(remote_under_test: Remote) -> None:
    r = remote_under_test
    assert isinstance(await r.push("c-001"), CreateReserved)
    attempt = await r.finalized("c-001")
    creates = await r.stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.object_id for e in creates] == [attempt["remote_id"]]


async def test_a_lost_answer_is_resolved_without_a_second_object(remote_under_test: Remote) -> None:
    """The POST lands and its answer is lost: the demo pack replays under its key, the
    HubSpot pack (no key) looks its locator up. Either way one object, finalized."""
    r = remote_under_test
    await r.stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="reset_after_effect", times=1)
    )
    await r.push("c-001")
    attempt = await r.finalized("c-001")
    objects = await r.stack.sandbox.objects("contacts")
    assert [o["id"] for o in objects] == [attempt["remote_id"]]


async def test_a_patch_reaches_the_remote(remote_under_test: Remote) -> None:
    r = remote_under_test
    await r.push("c-001")
    attempt = await r.finalized("c-001")
    await set_field(r.stack.pool, "Contact", "c-001", "FirstName", "Changed")
    assert isinstance(await r.push("c-001"), PatchQueued)
    rows = await settled(r.stack, r.key("c-001"))
    assert [row["status"] for row in rows] == ["succeeded"]
    objects = await r.stack.sandbox.objects("contacts")
    (only,) = [o for o in objects if o["id"] == attempt["remote_id"]]
    assert only["properties"]["firstname"] == "Changed"  # type: ignore[index]


async def test_a_rate_limit_answer_applies_nothing_and_is_sent_again(
    remote_under_test: Remote,
) -> None:
    """A 429 (PROF-1: refused before processing) is re-sent after Retry-After: one object."""
    r = remote_under_test
    await r.stack.sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=CONTACTS, action="status", status=429, retry_after="1", times=1
        )
    )
    await r.push("c-001")
    attempt = await r.finalized("c-001")
    objects = await r.stack.sandbox.objects("contacts")
    assert [o["id"] for o in objects] == [attempt["remote_id"]]
