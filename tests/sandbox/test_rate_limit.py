"""The sandbox's rate limit (REMOTE-NOTES burst window, SPEC PROF-3): token bucket per type."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from cli.stack.sandbox_cmd import load_sandbox_config
from sandbox.client import SandboxClient
from sandbox.config import ObjectTypeConfig, RateLimitConfig
from sandbox.rate_limit import DailyLimit, RateLimitSettings
from tests.sandbox.conftest import StartSandbox
from tests.sandbox.support import COMPANIES, CONTACTS, contact, eventually, make_config


def limit(requests: int, per_seconds: float) -> RateLimitConfig:
    return RateLimitConfig(requests=requests, per_seconds=per_seconds)


async def test_an_empty_bucket_answers_429_naming_the_policy_and_applies_nothing(
    start_sandbox: StartSandbox,
) -> None:
    server = start_sandbox(make_config(rate_limit=limit(3, 10)))
    async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as http:
        sandbox = SandboxClient(server.url, http)
        answers = [await http.post(CONTACTS, json=contact(f"c{i}@example.com")) for i in range(4)]
        other_type = await http.post(COMPANIES, json={"properties": {"name": "Acme"}})
        report = await sandbox.rate_limit()
        objects = await sandbox.objects("contacts")

    assert [a.status_code for a in answers] == [201, 201, 201, 429]
    refused = answers[3]
    assert refused.json()["policyName"] == "TEN_SECONDLY_ROLLING"
    assert refused.json()["errorType"] == "RATE_LIMIT"
    assert 1 <= int(refused.headers["Retry-After"]) <= 4  # one token refills in 10/3 s
    assert refused.headers["X-HubSpot-RateLimit-Max"] == "3"
    assert other_type.status_code == 201  # its own bucket
    assert len(objects) == 3  # the refused create was never applied
    assert report.throttled == {"contacts": 1}
    assert [(r.method, r.object_type) for r in report.applied] == [
        ("POST", "contacts"), ("POST", "contacts"), ("POST", "contacts"), ("POST", "companies"),
    ]  # fmt: skip


async def test_reads_and_patches_count_against_the_same_bucket(
    start_sandbox: StartSandbox,
) -> None:
    server = start_sandbox(make_config(rate_limit=limit(2, 60)))
    async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as http:
        created = (await http.post(CONTACTS, json=contact("dee@example.com"))).json()
        read = await http.get(f"{CONTACTS}/{created['id']}")
        patched = await http.patch(f"{CONTACTS}/{created['id']}", json=contact("d2@example.com"))
        stored = await SandboxClient(server.url, http).objects("contacts")

    assert (read.status_code, patched.status_code) == (200, 429)
    assert stored[0]["properties"]["email"] == "dee@example.com"  # type: ignore[index]


async def test_the_bucket_refills_at_the_configured_rate(start_sandbox: StartSandbox) -> None:
    server = start_sandbox(make_config(rate_limit=limit(2, 1)))
    async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as http:
        sandbox = SandboxClient(server.url, http)
        for i in range(3):
            await http.post(CONTACTS, json=contact(f"r{i}@example.com"))
        refused_at = time.monotonic()

        async def create() -> int:
            return (await http.post(CONTACTS, json=contact("late@example.com"))).status_code

        await eventually(create, lambda status: status == 201, timeout_s=10.0)
        waited = time.monotonic() - refused_at
        report = await sandbox.rate_limit()

    assert waited >= 0.3  # a token takes 0.5 s at 2/s; the margin covers the probe's own latency
    assert report.throttled["contacts"] >= 2  # the third create and at least one probe
    assert len(report.applied) == 3


async def test_the_admin_api_sets_per_type_limits_and_lifts_them(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.set_rate_limit(RateLimitSettings(object_types={"contacts": limit(1, 1)}))
    first = await http.post(CONTACTS, json=contact("e1@example.com"))
    second = await http.post(CONTACTS, json=contact("e2@example.com"))
    company = [await http.post(COMPANIES, json={"properties": {"name": f"Co{i}"}}) for i in (1, 2)]
    report = await sandbox.rate_limit()
    await sandbox.set_rate_limit(RateLimitSettings())
    lifted = await http.post(CONTACTS, json=contact("e3@example.com"))
    await sandbox.reset()
    after_reset = await sandbox.rate_limit()

    assert (first.status_code, second.status_code, lifted.status_code) == (201, 429, 201)
    assert second.json()["policyName"] == "SECONDLY"
    assert [c.status_code for c in company] == [201, 201]
    assert report.settings.limit_for("contacts") == limit(1, 1)
    assert after_reset.throttled == {} and after_reset.applied == []


async def test_a_bad_admin_setting_is_422_and_keeps_the_limits(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    answer = await http.put("/_sandbox/rate-limit", json={"rate_limit": {"requests": 0}})

    assert answer.status_code == 422
    assert "requests" in answer.json()["message"]
    assert (await sandbox.rate_limit()).settings == RateLimitSettings()


async def test_a_type_override_in_the_config_beats_the_default(
    start_sandbox: StartSandbox,
) -> None:
    types = {"contacts": ObjectTypeConfig(rate_limit=limit(1, 10)), "deals": ObjectTypeConfig()}
    server = start_sandbox(make_config(object_types=types, rate_limit=limit(5, 10)))
    async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as http:
        contacts = [await http.post(CONTACTS, json=contact(f"o{i}@example.com")) for i in (1, 2)]
        deals = [await http.post("/crm/v3/objects/deals", json={"properties": {}}) for _ in "abc"]

    assert [c.status_code for c in contacts] == [201, 429]
    assert [d.status_code for d in deals] == [201, 201, 201]


def test_the_cli_flag_sets_the_default_limit() -> None:
    config = load_sandbox_config(None, None, "100/10")

    assert config.rate_limit == limit(100, 10)
    with pytest.raises(ValueError, match="REQUESTS/SECONDS"):
        load_sandbox_config(None, None, "100")


def test_the_cli_rejects_a_malformed_limit_without_a_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "sandbox", "--rate-limit", "fast"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode != 0
    assert "REQUESTS/SECONDS" in result.stderr
    assert "Traceback" not in result.stderr


async def test_the_daily_limit_answers_429_daily_until_the_days_midnight(
    start_sandbox: StartSandbox,
) -> None:
    """Issue 33 item 3: HubSpot's daily limit, per account (every type), reset at midnight
    in its time zone; the admin API's clock offset turns the day."""
    now = time.time()
    noon_offset = (86_400 - now % 86_400) + 12 * 3600  # tomorrow 12:00 UTC
    server = start_sandbox(make_config())
    async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as http:
        sandbox = SandboxClient(server.url, http)
        daily = DailyLimit(requests=2)
        await sandbox.set_rate_limit(
            RateLimitSettings(daily=daily, clock_offset_seconds=noon_offset)
        )
        answers = [await http.post(CONTACTS, json=contact(f"d{i}@example.com")) for i in range(2)]
        other_type = await http.post(COMPANIES, json={"properties": {"name": "Acme"}})
        turned = RateLimitSettings(daily=daily, clock_offset_seconds=noon_offset + 12 * 3600 + 1)
        await sandbox.set_rate_limit(turned)
        next_day = await http.post(COMPANIES, json={"properties": {"name": "Acme"}})
        report = await sandbox.rate_limit()

    assert [a.status_code for a in answers] == [201, 201]
    assert other_type.status_code == 429  # the day is the account's, not the type's
    assert other_type.json()["policyName"] == "DAILY"
    assert 12 * 3600 - 60 <= int(other_type.headers["Retry-After"]) <= 12 * 3600 + 1
    assert other_type.headers["X-HubSpot-RateLimit-Daily-Remaining"] == "0"
    assert next_day.status_code == 201
    assert report.throttled == {"companies": 1}
