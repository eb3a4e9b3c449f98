"""The packs the shared e2e scenarios run over (issues 51 and 52: the same scenarios for
every remote family), each against the sandbox mode it is written for.

A `PackCase` says what differs between them and nothing else: the pack and the action
slot under test, the records it pushes, the answers its remote gives (a create's and a
PATCH's status, the refusal it declares not applied, the daily limit's status and reset
rule) and how its sandbox mode's daily allocation is set and its clock moved. The
scenarios themselves (tests/e2e/test_pack_scenarios.py) name no vendor.

- demo: examples/demo-pack.yaml's deals slot (the `sandbox-locator` profile: locator
  recovery, If-Match) on the generous sandbox;
- hubspot: examples/hubspot.yaml's contacts slot on the `hubspot` mode;
- salesforce: examples/salesforce.yaml's contacts slot on the `salesforce` mode.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any, Final
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
import yaml
from temporalio.client import Client

from protocol.admission import AdmissionDecision, SaveRequest
from protocol.credential_hosts import hosts_variable, secret_variable
from protocol.identity import link_key
from protocol.messages import LinkView
from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig
from sandbox.faults import FaultRuleSpec
from sandbox.rate_limit import DailyLimit, RateLimitSettings, settings_from
from sandbox.server import BackgroundSandbox
from services.daily_quota import forget_quotas
from services.dispatch_hooks import DispatchHooks
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from tests.e2e.conftest import EXAMPLES, Stack, demo_manifest
from tests.e2e.hubspot_support import hubspot_config, hubspot_manifest
from tests.e2e.support import eventually
from worker.crm import report_save
from worker.runtime import build_worker, remote_http_client, tls_context
from workflows.link import LinkWorkflow

Doc = dict[str, Any]
USER: Final = "alice"
MIRROR: Final = ("remote_id__c", "remote_provenance__c")


class QuotaClock(DispatchHooks):
    """The worker's clock, moved by the test instead of waiting a day; waiting runs look
    again often (in production they sleep until the reset in one timer)."""

    quota_recheck_s = 0.3

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


def _next_utc_midnight(at: datetime) -> datetime:
    return datetime.combine(at.astimezone(UTC).date() + timedelta(days=1), time(0), tzinfo=UTC)


def _rolling_day(at: datetime) -> datetime:
    return at + timedelta(hours=24)


def salesforce_config() -> SandboxConfig:
    return SandboxConfig.model_validate(
        yaml.safe_load((EXAMPLES / "sandbox-salesforce.yaml").read_text(encoding="utf-8"))
    )


def generous_config() -> SandboxConfig:
    return SandboxConfig.model_validate(
        yaml.safe_load((EXAMPLES / "sandbox.yaml").read_text(encoding="utf-8"))
    )


@pytest.fixture(scope="session")
def salesforce_remote() -> Iterator[BackgroundSandbox]:
    """A session sandbox in the salesforce mode (examples/sandbox-salesforce.yaml)."""
    with BackgroundSandbox(salesforce_config()) as server:
        yield server


@functools.cache
def _salesforce_manifest() -> Doc:
    loaded: Doc = yaml.safe_load((EXAMPLES / "salesforce.yaml").read_text(encoding="utf-8"))
    return loaded


def salesforce_manifest(base_url: str) -> Doc:
    """examples/salesforce.yaml with its profile's baseUrl pointed at `base_url` (a copy)."""
    manifest = copy.deepcopy(_salesforce_manifest())
    for profile in manifest["profiles"]:
        profile["baseUrl"] = base_url
    return manifest


# A sandbox mode's daily allocation set to `requests`, then its day moved `seconds` on.
Limit = Callable[[SandboxClient, int], Awaitable[None]]
Advance = Callable[[SandboxClient, int, float], Awaitable[None]]


async def _generous_limit(sandbox: SandboxClient, requests: int) -> None:
    await sandbox.set_rate_limit(RateLimitSettings(daily=DailyLimit(requests=requests)))


async def _generous_advance(sandbox: SandboxClient, requests: int, seconds: float) -> None:
    daily = DailyLimit(requests=requests)
    await sandbox.set_rate_limit(RateLimitSettings(daily=daily, clock_offset_seconds=seconds))


async def _hubspot_limit(sandbox: SandboxClient, requests: int) -> None:
    limits = hubspot_config().hubspot_limits
    daily = limits.daily.model_copy(update={"requests": requests}) if limits.daily else None
    await sandbox.set_limits(limits.model_copy(update={"daily": daily}))


async def _salesforce_limit(sandbox: SandboxClient, requests: int) -> None:
    limits = salesforce_config().salesforce_limits
    await sandbox.set_limits(limits.model_copy(update={"allocation": requests}))


async def _strict_advance(sandbox: SandboxClient, requests: int, seconds: float) -> None:
    del requests  # a strict mode's clock moves; its limits stay as set
    await sandbox.advance_clock(seconds)


async def _generous_reset(sandbox: SandboxClient) -> None:
    await sandbox.set_rate_limit(settings_from(generous_config()))


async def _hubspot_reset(sandbox: SandboxClient) -> None:
    await sandbox.set_limits(hubspot_config().hubspot_limits)


async def _salesforce_reset(sandbox: SandboxClient) -> None:
    await sandbox.set_limits(salesforce_config().salesforce_limits)


@dataclass(frozen=True)
class PackCase:
    """One pack, the action slot the scenarios push through, and its remote's ways."""

    name: str
    server: str  # the session fixture serving its sandbox mode
    manifest: Callable[[str], Doc]  # the pack pointed at a base URL (a fresh copy)
    slot: str
    owner: str
    source_object: str
    fields: Callable[[str], Doc]  # a record's fields by its id
    patched: tuple[str, str]  # (source field, remote property) the PATCH scenario changes
    refusal: FaultRuleSpec  # an answer the pack declares not applied, once
    daily_status: int  # the status of the remote's spent daily limit
    reset_after: Callable[[datetime], datetime]  # the reset its pack declares
    limit: Limit
    advance: Advance
    reset_limits: Callable[[SandboxClient], Awaitable[None]]
    patch_status: int
    flat_objects: bool = False  # objects carry fields at the top level, not in `properties`

    @functools.cached_property
    def slot_doc(self) -> Doc:
        slots: list[Doc] = self.manifest("http://127.0.0.1:9")["actionSlots"]
        (slot,) = [s for s in slots if s["id"] == self.slot]
        return slot

    @functools.cached_property
    def destination(self) -> str:
        return str(self.slot_doc["destinationSlot"])

    @functools.cached_property
    def target_object(self) -> str:
        doc = self.manifest("http://127.0.0.1:9")
        (dest,) = [d for d in doc["destinationSlots"] if d["id"] == self.destination]
        return str(dest["targetObject"])

    @functools.cached_property
    def create_path(self) -> str:
        return str(self.slot_doc["createPath"]).replace("{target}", self.target_object)

    def key(self, record_id: str) -> str:
        return link_key(self.owner, self.slot, self.source_object, record_id, self.destination)

    def properties(self, obj: Doc) -> Doc:
        found: Doc = obj if self.flat_objects else obj["properties"]
        return found

    def object_id(self, obj: Doc) -> str:
        return str(obj["Id"] if self.flat_objects else obj["id"])


def _refusal(status: int, retry_after: str | None, path: str) -> FaultRuleSpec:
    return FaultRuleSpec(
        method="POST", path=path, action="status", status=status, retry_after=retry_after, times=1
    )


CASES: Final = (
    PackCase(
        name="demo",
        server="remote",
        manifest=demo_manifest,
        slot="push-deal",
        owner="demo-owner",
        source_object="Opportunity",
        fields=lambda r: {"Name": f"Deal {r}", "Amount": 1000},
        patched=("Name", "dealname"),
        refusal=_refusal(429, "1", "/crm/v3/objects/deals"),  # ten-secondly policy
        daily_status=429,
        reset_after=_next_utc_midnight,
        limit=_generous_limit,
        advance=_generous_advance,
        reset_limits=_generous_reset,
        patch_status=200,
    ),
    PackCase(
        name="hubspot",
        server="hubspot_remote",
        manifest=hubspot_manifest,
        slot="push-contact",
        owner="demo-owner",
        source_object="Contact",
        fields=lambda r: {"FirstName": "Ada", "LastName": r, "Email": f"{r}@hs.test"},
        patched=("FirstName", "firstname"),
        refusal=_refusal(429, "1", "/crm/v3/objects/contacts"),  # ten-secondly policy
        daily_status=429,
        reset_after=_next_utc_midnight,
        limit=_hubspot_limit,
        advance=_strict_advance,
        reset_limits=_hubspot_reset,
        patch_status=200,
    ),
    PackCase(
        name="salesforce",
        server="salesforce_remote",
        manifest=salesforce_manifest,
        slot="sf-contact",
        owner="crm-owner",
        source_object="Contact",
        fields=lambda r: {"FirstName": "Ada", "LastName": r, "Email": f"{r}@sf.test"},
        patched=("FirstName", "FirstName"),
        # 400 UNABLE_TO_LOCK_ROW (the mode's body for a 400): nothing applied, retry later.
        refusal=_refusal(400, None, "/services/data/v59.0/sobjects/Contact/"),
        daily_status=403,  # REQUEST_LIMIT_EXCEEDED
        reset_after=_rolling_day,
        limit=_salesforce_limit,
        advance=_strict_advance,
        reset_limits=_salesforce_reset,
        patch_status=204,
        flat_objects=True,
    ),
)
IDS: Final = tuple(f"r-{i:02}" for i in range(3))


@dataclass
class PackRun:
    """A pack applied, its records loaded and a worker serving it, for one test."""

    case: PackCase
    server: BackgroundSandbox
    stack: Stack  # pool, client, task queue, sandbox; its `close` ends this test's runs
    hooks: QuotaClock
    touched: set[str] = field(default_factory=set)

    @property
    def pool(self) -> asyncpg.Pool:
        return self.stack.pool

    @property
    def sandbox(self) -> SandboxClient:
        return self.stack.sandbox

    async def push(self, record_id: str) -> AdmissionDecision:
        c = self.case
        self.stack.touched.add(c.key(record_id))
        save = SaveRequest(
            connector_owner_key=c.owner,
            action_slot_id=c.slot,
            destination_slot_id=c.destination,
            source_object=c.source_object,
            source_record_id=record_id,
            originating_user_id=USER,
        )
        return await report_save(self.pool, self.stack.client, self.stack.task_queue, save)

    async def status(self, record_id: str) -> str | None:
        row = await self.pool.fetchrow(
            "SELECT status FROM connector_push_attempt WHERE link_key = $1 "
            "ORDER BY attempt_ordinal DESC LIMIT 1",
            self.case.key(record_id),
        )
        return None if row is None else str(row["status"])

    async def finalized(self, record_id: str, timeout_s: float = 20.0) -> str:
        """Wait for the record's create to finalize; its remote id."""
        await eventually(lambda: self.status(record_id), lambda s: s == "finalized", timeout_s)
        link = await self.stack.link(self.case.key(record_id))
        assert link is not None
        return str(link["remote_id"])

    async def view(self, record_id: str) -> LinkView:
        view: LinkView = await self.stack.handle(self.case.key(record_id)).query(LinkWorkflow.state)
        return view

    async def objects(self) -> list[Doc]:
        return await self.sandbox.objects(self.case.target_object)

    async def journal(self) -> list[tuple[str | None, int | None]]:
        """Every try and look-up sent, in order: (outcome, status)."""
        rows = await self.pool.fetch(
            "SELECT outcome, status FROM connector_send_journal ORDER BY journal_id"
        )
        return [(r["outcome"], r["status"]) for r in rows]

    async def move_clocks(self, until: datetime, requests: int) -> None:
        """Move the worker's clock and the remote's to `until`, as if the time passed."""
        seconds = (until - self.hooks.now()).total_seconds()
        self.hooks.offset += timedelta(seconds=seconds)
        await self.case.advance(self.sandbox, requests, seconds)


def set_credential(monkeypatch: pytest.MonkeyPatch, manifest: Doc, base_url: str) -> None:
    """Each profile's secret where the transport reads it, bound to the sandbox (S-3)."""
    for profile in manifest["profiles"]:
        ref = profile["credentialRef"]
        monkeypatch.setenv(secret_variable(ref), f"token-for-{ref}")
        monkeypatch.setenv(hosts_variable(ref), urlsplit(base_url).netloc)


async def _load(pool: asyncpg.Pool, case: PackCase, manifest: Doc) -> None:
    mapped = [m["sourceField"] for m in case.slot_doc["mappings"]]
    records = [{"object": case.source_object, "id": r, "fields": case.fields(r)} for r in IDS]
    grants = [
        {"user": USER, "object": case.source_object, "records": "*", "fields": [*mapped, *MIRROR]}
    ]
    doc = parse_records_document({"owner": case.owner, "records": records, "grants": grants})
    async with pool.acquire() as conn:
        await apply_pack(conn, manifest)
        await load_records(conn, doc)
    forget_quotas()


@contextlib.asynccontextmanager
async def pack_run(
    case: PackCase,
    server: BackgroundSandbox,
    pool: asyncpg.Pool,
    client: Client,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[PackRun]:
    manifest = case.manifest(server.url)
    set_credential(monkeypatch, manifest, server.url)
    await _load(pool, case, manifest)
    hooks = QuotaClock()
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=10.0, verify=tls_context()) as admin,
        remote_http_client() as http,
    ):
        sandbox = SandboxClient(server.url, admin)
        await sandbox.reset()
        await case.reset_limits(sandbox)
        async with build_worker(client, pool, http, task_queue, hooks=hooks):
            stack = Stack(pool, client, task_queue, sandbox)
            try:
                yield PackRun(case, server, stack, hooks)
            finally:
                await stack.close()


def edit_slot(manifest: Doc, slot: str) -> Doc:
    """The action slot `slot` of `manifest` (to edit in place)."""
    (found,) = [s for s in manifest["actionSlots"] if s["id"] == slot]
    return found  # type: ignore[no-any-return]
