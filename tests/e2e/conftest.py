"""End-to-end harness: real Postgres, real Temporal, the sandbox remote over HTTP.

Each test gets a fresh database with the demo pack (profiles re-pointed at the
session's sandbox) and demo records, a worker on its own task queue, and a
`push` helper that reports a save exactly as the CRM would.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest
import yaml
from temporalio.client import Client
from temporalio.service import RPCError

from protocol.action_callback import CallbackTarget
from protocol.admission import AdmissionDecision, SaveRequest
from protocol.identity import link_key
from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig
from sandbox.server import BackgroundSandbox
from services.dispatch_hooks import DispatchHooks
from services.packs import apply_pack
from services.record_loader import RecordsDocument, load_records, parse_records_document
from worker.crm import report_save, workflow_id
from worker.runtime import build_worker, remote_http_client, tls_context

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OWNER = "demo-owner"


@pytest.fixture(scope="session")
def remote() -> Iterator[BackgroundSandbox]:
    config = SandboxConfig.model_validate(yaml.safe_load((EXAMPLES / "sandbox.yaml").read_text()))
    with BackgroundSandbox(config) as server:
        yield server


@pytest.fixture
async def sandbox(remote: BackgroundSandbox) -> AsyncIterator[SandboxClient]:
    async with httpx.AsyncClient(base_url=remote.url, timeout=10.0, verify=tls_context()) as http:
        client = SandboxClient(remote.url, http)
        await client.reset()
        yield client


def demo_manifest(base_url: str) -> dict[str, object]:
    """The demo pack with its profiles pointed at `base_url`; a fresh copy each call (tests
    edit it). Parsed once per base URL: the YAML costs more than the rest of a test's setup."""
    return copy.deepcopy(_demo_manifest(base_url))


@functools.cache
def _demo_manifest(base_url: str) -> dict[str, object]:
    text = (EXAMPLES / "demo-pack.yaml").read_text()
    text = re.sub(r"baseUrl: http://127\.0\.0\.1:\d+", f"baseUrl: {base_url}", text)
    loaded: dict[str, object] = yaml.load(text, Loader=yaml.CSafeLoader)
    return loaded


@functools.cache
def _demo_records() -> RecordsDocument:
    return parse_records_document(
        yaml.load((EXAMPLES / "demo-records.yaml").read_text(), Loader=yaml.CSafeLoader)
    )


@pytest.fixture
async def demo_db(db_pool: asyncpg.Pool, remote: BackgroundSandbox) -> asyncpg.Pool:
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo_manifest(remote.url))
        await load_records(conn, _demo_records())
    return db_pool


@dataclass
class Stack:
    pool: asyncpg.Pool
    client: Client
    task_queue: str
    sandbox: SandboxClient
    touched: set[str] = field(default_factory=set)
    # The worker's workflow-action completion targets by endpoint (S-2), as its ingress
    # policy would give them; the worker reads this very dict, so a test may add one.
    callback_targets: dict[str, CallbackTarget] = field(default_factory=dict)

    async def push(
        self,
        record_id: str,
        *,
        slot: str = "push-contact",
        obj: str = "Contact",
        dest: str = "remote-contacts",
        user: str = "alice",
    ) -> AdmissionDecision:
        save = SaveRequest(
            connector_owner_key=OWNER,
            action_slot_id=slot,
            destination_slot_id=dest,
            source_object=obj,
            source_record_id=record_id,
            originating_user_id=user,
        )
        self.touched.add(link_key(OWNER, slot, obj, record_id, dest))
        return await report_save(self.pool, self.client, self.task_queue, save)

    async def close(self) -> None:
        """Workflow ids are per link key, shared by every test: end this test's runs."""
        for key in self.touched:
            with contextlib.suppress(RPCError):
                await self.handle(key).terminate("test finished")

    async def attempt(self, key: str) -> asyncpg.Record:
        row = await self.pool.fetchrow(
            "SELECT * FROM connector_push_attempt JOIN connector_push_attempt_frozen"
            " USING (attempt_id) WHERE link_key = $1 "
            "ORDER BY attempt_ordinal DESC LIMIT 1",
            key,
        )
        assert row is not None
        return row

    async def link(self, key: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM connector_remote_link WHERE link_key = $1", key
        )

    def handle(self, key: str):  # type: ignore[no-untyped-def]
        return self.client.get_workflow_handle(workflow_id(key))


def contact_key(record_id: str) -> str:
    return link_key(OWNER, "push-contact", "Contact", record_id, "remote-contacts")


def deal_key(record_id: str) -> str:
    return link_key(OWNER, "push-deal", "Opportunity", record_id, "remote-deals")


def company_key(record_id: str) -> str:
    return link_key(OWNER, "push-company", "Account", record_id, "remote-companies")


@pytest.fixture
def hooks() -> DispatchHooks:
    return DispatchHooks()


@pytest.fixture
def callback_targets() -> dict[str, CallbackTarget]:
    """Where the stack's worker sends workflow-action completions (S-2): none here; the
    ingress tests give their policy's."""
    return {}


@pytest.fixture
async def stack(
    demo_db: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    sandbox: SandboxClient,
    hooks: DispatchHooks,
    callback_targets: dict[str, CallbackTarget],
) -> AsyncIterator[Stack]:
    async with remote_http_client() as http:
        worker = build_worker(
            temporal_client,
            demo_db,
            http,
            task_queue,
            hooks=hooks,
            callback_targets=callback_targets,
        )
        async with worker:
            stack = Stack(
                demo_db, temporal_client, task_queue, sandbox, callback_targets=callback_targets
            )
            try:
                yield stack
            finally:
                await stack.close()
