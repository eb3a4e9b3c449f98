"""`services.remote.send` against the sandbox remote over real HTTP: one deadline per request
(SPEC §17 G-7) and bounded answers (S-6). No Postgres or Temporal: the request's deadline
is given as the activity's would be (`LinkStep.deadline`, on the event loop's clock)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from pydantic import JsonValue

from protocol.manifest import parse_manifest
from protocol.outcome import Observation, Transport, parse_retry_after
from protocol.snapshots import ProfileSnapshot
from protocol.timeouts import REQUEST_DEADLINE_MARGIN
from sandbox.client import SandboxClient
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services import remote
from tests.e2e.conftest import demo_manifest
from tests.e2e.support import eventually
from worker.runtime import remote_http_client

CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"
MARGIN_S = REQUEST_DEADLINE_MARGIN.total_seconds()


def _plain(base_url: str) -> ProfileSnapshot:
    """The demo's profile without idempotency (its not-applied budget is 900 s)."""
    return ProfileSnapshot.of(parse_manifest(demo_manifest(base_url)).profiles[1])


def _deadline_in(seconds: float) -> float:
    """An activity deadline that leaves a request `seconds` after the margin."""
    return asyncio.get_running_loop().time() + MARGIN_S + seconds


def _company(name: str) -> JsonValue:
    return {"properties": {"name": name}}


async def _post(
    http: httpx.AsyncClient, profile: ProfileSnapshot, deadline: float | None = None
) -> Observation:
    return await remote.send(
        http, "POST", profile, COMPANIES, {}, _company("Acme"), deadline=deadline
    )


@pytest.mark.timeout(30)
async def test_g7_a_dripping_answer_is_cut_at_the_one_deadline_not_per_read(
    remote: BackgroundSandbox, sandbox: SandboxClient
) -> None:
    """Each byte comes within the per-read timeout, the whole answer would take minutes:
    the request is cut at its overall deadline, after the write (it may have landed)."""
    await sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="drip_after_effect", drip_ms=300)
    )
    async with remote_http_client() as http:
        started = time.monotonic()
        obs = await _post(http, _plain(remote.url), _deadline_in(1.5))
        elapsed = time.monotonic() - started
    assert obs.transport is Transport.TIMEOUT
    assert 1.4 <= elapsed < 4.0
    assert len(await sandbox.objects("companies")) == 1  # it landed: ambiguous, not "not sent"


async def test_g7_a_request_with_no_time_left_stays_not_sent(
    remote: BackgroundSandbox, sandbox: SandboxClient
) -> None:
    async with remote_http_client() as http:
        obs = await _post(http, _plain(remote.url), _deadline_in(-0.5))
    assert obs.transport is Transport.NOT_SENT
    assert await sandbox.ledger() == []


@pytest.mark.timeout(30)
async def test_g7_a_deadline_passing_in_the_pool_wait_is_not_sent(
    remote: BackgroundSandbox, sandbox: SandboxClient
) -> None:
    """The pool wait counts against the same deadline: the second request waits for the
    only connection, which a hanging request holds, and leaves nothing at the remote."""
    await sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=COMPANIES, action="hang_after_effect", hang_ms=20_000, nth=1
        )
    )
    profile = _plain(remote.url)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as http:
        hanging = asyncio.create_task(_post(http, profile))
        try:
            await eventually(sandbox.ledger, bool)  # the first request holds the connection
            started = time.monotonic()
            obs = await _post(http, profile, _deadline_in(1.0))
            assert time.monotonic() - started < 3.0
        finally:
            hanging.cancel()
    assert obs.transport is Transport.NOT_SENT
    assert len(await sandbox.ledger()) == 1


async def test_s6_an_answer_over_the_size_cap_is_unusable_not_read_whole(
    remote: BackgroundSandbox, sandbox: SandboxClient
) -> None:
    await sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=COMPANIES, action="status", status=201, body_bytes=8 * 2**20
        )
    )
    async with remote_http_client() as http:
        obs = await _post(http, _plain(remote.url))
    assert obs.transport is Transport.ERROR_AFTER_SEND and obs.body is None


async def test_s6_a_deeply_nested_answer_is_unusable_without_a_recursion_error(
    remote: BackgroundSandbox, sandbox: SandboxClient
) -> None:
    await sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=COMPANIES, action="status", status=201, body_depth=100_000
        )
    )
    async with remote_http_client() as http:
        obs = await _post(http, _plain(remote.url))
    assert obs.transport is Transport.ERROR_AFTER_SEND and obs.body is None


async def test_s6_a_huge_retry_after_is_capped_to_the_not_applied_budget(
    remote: BackgroundSandbox, sandbox: SandboxClient
) -> None:
    await sandbox.add_fault(
        FaultRuleSpec(
            method="POST", path=COMPANIES, action="status", status=429, retry_after="86400000000"
        )
    )
    profile = _plain(remote.url)
    async with remote_http_client() as http:
        obs = await _post(http, profile)
    assert obs.transport is Transport.RESPONSE and obs.status == 429
    assert obs.headers["retry-after"] == str(profile.not_applied_budget_seconds)
    assert parse_retry_after(obs.headers["retry-after"], obs.now) == 900.0
