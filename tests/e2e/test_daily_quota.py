"""Daily quotas end to end (issue 33 item 3, SPEC NF-8): a spent daily share makes pushes
wait — not parked, not failed, visible in `status`, `links show` and the run's state —
and they resume by themselves at the reset; a 429 naming the remote's daily policy
pauses the whole budget the same way.

The worker's quota clock is moved instead of waiting a day: it starts at noon, and the
test moves it past midnight. Waiting runs re-check every `quota_recheck_s` (in
production they sleep until the reset in one timer).
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import Any, cast

import asyncpg
import pytest

from cli.link_views import key_view
from protocol.admission import PatchQueued
from protocol.messages import LinkView
from sandbox.rate_limit import DailyLimit, RateLimitSettings
from sandbox.server import BackgroundSandbox
from services.daily_quota import forget_quotas
from services.dispatch_hooks import DispatchHooks
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from services.status import read_status
from tests.e2e.conftest import Stack, contact_key, demo_manifest
from tests.e2e.patch_support import finalized_contact, patch_rows, patches, set_field, settled
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow


class QuotaClock(DispatchHooks):
    """The worker's quota clock, moved by the test; waiting runs look again often."""

    quota_recheck_s = 0.3

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def move_to(self, instant: datetime) -> None:
        self.offset = instant - datetime.now(UTC)


@pytest.fixture
def hooks() -> DispatchHooks:
    return QuotaClock()


# Tomorrow (real time), so a run crossing a real midnight still finds the reset ahead.
NOON = datetime.combine(datetime.now(UTC).date() + timedelta(days=1), time(12), tzinfo=UTC)
MIDNIGHT = NOON + timedelta(hours=12)


async def _with_quota(pool: asyncpg.Pool, remote: BackgroundSandbox, **daily: Any) -> None:
    manifest: Any = demo_manifest(remote.url)
    manifest["profiles"][0]["rateLimit"] = {"requests": 100, "perSeconds": 10, **daily}
    async with pool.acquire() as conn:
        await apply_pack(conn, manifest)
    forget_quotas()


async def _contacts(pool: asyncpg.Pool, n: int) -> list[str]:
    ids = [f"cq-{i:03}" for i in range(n)]
    fields = ["FirstName", "LastName", "Email", "Phone", "remote_id__c", "remote_provenance__c"]
    doc = parse_records_document(
        {
            "records": [
                {"object": "Contact", "id": r, "fields": {"FirstName": "Q", "Email": f"{r}@q.test"}}
                for r in ids
            ],
            "grants": [{"user": "alice", "object": "Contact", "records": "*", "fields": fields}],
        }
    )
    async with pool.acquire() as conn:
        await load_records(conn, doc)
    return ids


async def _statuses(pool: asyncpg.Pool, ids: list[str]) -> list[str]:
    rows = await pool.fetch(
        "SELECT status FROM connector_push_attempt WHERE link_key = ANY($1::text[])",
        [contact_key(r) for r in ids],
    )
    return sorted(r["status"] for r in rows)


def _sandbox_at(instant: datetime, daily: DailyLimit) -> RateLimitSettings:
    offset = (instant - datetime.now(UTC)).total_seconds()
    return RateLimitSettings(daily=daily, clock_offset_seconds=offset)


async def _view(stack: Stack, record_id: str) -> LinkView:
    view: LinkView = await stack.handle(contact_key(record_id)).query(LinkWorkflow.state)
    return view


async def test_a_spent_daily_share_waits_visibly_and_resumes_after_the_reset(
    stack: Stack, remote: BackgroundSandbox, hooks: QuotaClock
) -> None:
    hooks.move_to(NOON)
    await _with_quota(stack.pool, remote, dailyQuota=10, dailyShare=0.5)
    ids = await _contacts(stack.pool, 6)

    for record_id in ids:
        await stack.push(record_id)

    # Five of six reach the remote; the sixth waits for the reset, pending, not parked.
    await eventually(lambda: _statuses(stack.pool, ids), lambda s: s.count("finalized") == 5, 8.0)
    assert await _statuses(stack.pool, ids) == ["finalized"] * 5 + ["pending"]
    (waiting,) = [r for r in ids if (await stack.attempt(contact_key(r)))["status"] == "pending"]
    view = await eventually(
        lambda: _view(stack, waiting), lambda v: v.quota_wait_until is not None, 5.0
    )
    assert view.quota_wait_until == MIDNIGHT and not view.needs_operator
    async with stack.pool.acquire() as conn:
        status = await read_status(conn, hooks.now())
        # `links show` reads Postgres alone (its command takes a plain connection).
        shown = await key_view(cast(asyncpg.Connection, conn), contact_key(waiting), False)
    (day,) = status.daily_quotas
    assert (day.spent, day.allowance, day.resets_at, day.waiting) == (5, 5, MIDNIGHT, True)
    assert status.parked_total == 0
    assert shown["waiting_for_daily_quota_until"] == MIDNIGHT and shown["park_reason"] is None
    assert len(await stack.sandbox.objects("contacts")) == 5

    # The day turns: the waiting create is sent by itself, on the new day's quota.
    hooks.move_to(MIDNIGHT + timedelta(seconds=2))
    await eventually(lambda: _statuses(stack.pool, ids), lambda s: s == ["finalized"] * 6, 8.0)
    assert len(await stack.sandbox.objects("contacts")) == 6
    async with stack.pool.acquire() as conn:
        status = await read_status(conn, hooks.now())
    assert [(d.spent, d.waiting) for d in status.daily_quotas] == [(1, False)]


async def test_a_429_naming_the_daily_limit_pauses_the_budget_until_the_reset(
    stack: Stack, remote: BackgroundSandbox, hooks: QuotaClock
) -> None:
    hooks.move_to(NOON)
    await _with_quota(stack.pool, remote, dailyQuota=1000)
    ids = await _contacts(stack.pool, 4)
    before = (await stack.sandbox.rate_limit()).settings
    # The remote's own daily limit is lower than declared (another integration spent it);
    # the sandbox's day runs on the same moved clock as the worker's.
    daily = DailyLimit(requests=2)
    await stack.sandbox.set_rate_limit(_sandbox_at(NOON, daily))
    try:
        for record_id in ids[:3]:
            await stack.push(record_id)
        await eventually(
            lambda: stack.sandbox.rate_limit(), lambda r: r.throttled.get("contacts") == 1, 8.0
        )
        refused = await eventually(
            lambda: stack.pool.fetch(
                "SELECT a.link_key FROM connector_send_journal j "
                "JOIN connector_push_attempt a USING (attempt_id) WHERE j.daily_refusal"
            ),
            lambda rows: len(rows) == 1,
            5.0,
        )
        # The whole budget pauses: a later save waits without asking the remote.
        await stack.push(ids[3])
        later = await eventually(
            lambda: _view(stack, ids[3]), lambda v: v.quota_wait_until is not None, 5.0
        )
        assert later.quota_wait_until == MIDNIGHT and not later.needs_operator
        async with stack.pool.acquire() as conn:
            (day,) = (await read_status(conn, hooks.now())).daily_quotas
        assert day.refused_by_remote and day.waiting and day.resets_at == MIDNIGHT
        assert (await stack.sandbox.rate_limit()).throttled == {"contacts": 1}
        # The refused create waits claimed (`processing`, its 429 journalled), the later one
        # unclaimed (`pending`): neither is parked.
        expected = ["finalized", "finalized", "pending", "processing"]
        assert await _statuses(stack.pool, ids) == expected

        # The remote's day and ours turn: both waiting creates go, nothing parked.
        await stack.sandbox.set_rate_limit(_sandbox_at(MIDNIGHT + timedelta(seconds=2), daily))
        hooks.move_to(MIDNIGHT + timedelta(seconds=2))
        await eventually(lambda: _statuses(stack.pool, ids), lambda s: s == ["finalized"] * 4, 8.0)
        assert refused[0]["link_key"] in {contact_key(r) for r in ids[:3]}
    finally:
        await stack.sandbox.set_rate_limit(before)


async def test_a_patch_waits_for_the_quota_unclaimed_and_goes_after_the_reset(
    stack: Stack, remote: BackgroundSandbox, hooks: QuotaClock
) -> None:
    """The PATCH path spends the quota under its claim; with none left the claim rolls
    back, so the queued PATCH stays `pending` (no try journalled) until the reset."""
    hooks.move_to(NOON)
    await _with_quota(stack.pool, remote, dailyQuota=2, dailyShare=0.5)  # one a day
    link = await finalized_contact(stack)
    key = link["link_key"]
    await set_field(stack.pool, "Contact", "c-001", "FirstName", "Augusta")

    assert isinstance(await stack.push("c-001"), PatchQueued)
    view = await eventually(
        lambda: _view(stack, "c-001"), lambda v: v.quota_wait_until is not None, 5.0
    )
    assert view.quota_wait_until == MIDNIGHT and not view.needs_operator
    rows = await patch_rows(stack, key)
    assert [r["status"] for r in rows] == ["pending"]
    assert (
        await stack.pool.fetchval(
            "SELECT count(*) FROM connector_send_journal WHERE patch_id IS NOT NULL"
        )
        == 0
    )
    assert await patches(stack) == []

    hooks.move_to(MIDNIGHT + timedelta(seconds=2))
    rows = await settled(stack, key)
    assert [r["status"] for r in rows] == ["succeeded"]
    assert len(await patches(stack)) == 1
