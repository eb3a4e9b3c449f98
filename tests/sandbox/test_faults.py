"""Fault injection through real HTTP: resets, hangs, statuses, nth and seeded probability."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from sandbox.client import SandboxClient
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from sandbox.state import LedgerEntry
from tests.sandbox.conftest import StartSandbox
from tests.sandbox.support import CONTACTS, TRANSPORT_ERRORS, contact, eventually, make_config


def rule(action: str, **fields: object) -> FaultRuleSpec:
    """A rule on POSTs to the contacts collection."""
    return FaultRuleSpec.model_validate(
        {"method": "POST", "path": CONTACTS, "action": action, **fields}
    )


async def test_reset_after_effect_is_a_transport_error_but_the_object_exists(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("reset_after_effect", times=1))

    with pytest.raises(TRANSPORT_ERRORS):
        await http.post(CONTACTS, json=contact("ann@example.com"))

    [entry] = await sandbox.ledger("contacts", "create")
    assert entry.unique_values == {"email": "ann@example.com"}
    found = await http.get(f"{CONTACTS}/ann@example.com", params={"idProperty": "email"})
    assert found.json()["id"] == entry.object_id


async def test_reset_before_effect_is_a_transport_error_and_nothing_is_created(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("reset_before_effect", times=1))

    with pytest.raises(TRANSPORT_ERRORS):
        await http.post(CONTACTS, json=contact("bo@example.com"))

    assert await sandbox.ledger() == []
    assert await sandbox.objects("contacts") == []
    retried = await http.post(CONTACTS, json=contact("bo@example.com"))
    assert retried.status_code == 201


async def test_hang_after_effect_times_the_client_out_and_the_object_exists(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("hang_after_effect", times=1))

    with pytest.raises(httpx.ReadTimeout):
        await http.post(CONTACTS, json=contact("cy@example.com"), timeout=0.5)

    entries = await eventually(lambda: sandbox.ledger("contacts", "create"), lambda e: len(e) == 1)
    assert entries[0].unique_values == {"email": "cy@example.com"}


async def test_hang_is_bounded_by_hang_ms_then_the_connection_drops(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("hang_after_effect", hang_ms=200, times=1))

    started = time.monotonic()
    with pytest.raises(TRANSPORT_ERRORS):
        await http.post(CONTACTS, json=contact("dee@example.com"), timeout=10.0)

    assert 0.2 <= time.monotonic() - started < 5.0
    assert len(await sandbox.objects("contacts")) == 1


async def test_status_429_carries_retry_after_and_has_no_effect(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("status", status=429, retry_after=7, times=1))

    limited = await http.post(CONTACTS, json=contact("eve@example.com"))
    accepted = await http.post(CONTACTS, json=contact("eve@example.com"))

    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "7"
    assert limited.json()["policyName"] == "TEN_SECONDLY_ROLLING"
    assert accepted.status_code == 201
    assert len(await sandbox.ledger()) == 1


async def test_status_rule_answers_a_given_body(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("status", status=503, body={"message": "down"}))

    answer = await http.post(CONTACTS, json=contact("fay@example.com"))

    assert (answer.status_code, answer.json()) == (503, {"message": "down"})


async def test_nth_rule_fires_only_at_the_nth_matching_call(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("status", status=502, nth=3))

    statuses = [
        (await http.post(CONTACTS, json=contact(f"n{i}@example.com"))).status_code for i in range(5)
    ]

    assert statuses == [201, 201, 502, 201, 201]
    [view] = await sandbox.faults()
    assert (view.matched, view.fired) == (5, 1)


async def test_seeded_probability_rules_are_reproducible_across_fresh_servers(
    start_sandbox: StartSandbox,
) -> None:
    runs = [await _statuses_under_probability(start_sandbox) for _ in range(2)]

    assert runs[0] == runs[1]
    assert {201, 503} <= set(runs[0])


async def _statuses_under_probability(start_sandbox: StartSandbox) -> list[int]:
    server = start_sandbox(make_config(seed=42))
    async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as http:
        await SandboxClient(server.url, http).add_fault(rule("status", status=503, probability=0.5))
        return [
            (await http.post(CONTACTS, json=contact(f"p{i}@example.com"))).status_code
            for i in range(24)
        ]


async def test_delay_rule_delays_and_then_serves_normally(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("delay_ms", delay_ms=300))

    started = time.monotonic()
    answer = await http.post(CONTACTS, json=contact("gus@example.com"))

    assert time.monotonic() - started >= 0.3
    assert answer.status_code == 201


async def test_regex_rules_match_and_admin_routes_are_never_faulted(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(
        FaultRuleSpec(
            path=r"/crm/v3/objects/\w+/\d+", path_syntax="regex", action="status", status=500
        )
    )
    await sandbox.add_fault(FaultRuleSpec(path="*", action="status", status=418))

    created = await http.post(CONTACTS, json=contact("hal@example.com"))
    read = await http.get(f"{CONTACTS}/1001")

    assert (created.status_code, read.status_code) == (418, 500)
    assert await sandbox.ledger() == []


@pytest.mark.parametrize(
    "bad",
    [
        {"path": "/x", "action": "status"},
        {"path": "/x", "action": "delay_ms", "nth": 1, "probability": 0.5},
        {"path": "(", "path_syntax": "regex", "action": "reset_after_effect"},
        {"path": "/x", "action": "explode"},
    ],
)
async def test_invalid_rules_are_422(
    sandbox: SandboxClient, http: httpx.AsyncClient, bad: dict[str, object]
) -> None:
    answer = await http.post("/_sandbox/faults", json=bad)

    assert answer.status_code == 422
    assert await sandbox.faults() == []


async def test_clear_faults_stops_injection(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(rule("status", status=503))
    await sandbox.clear_faults()

    answer = await http.post(CONTACTS, json=contact("ivy@example.com"))

    assert answer.status_code == 201
    assert isinstance((await sandbox.ledger())[0], LedgerEntry)


async def test_stopping_the_server_cuts_a_hanging_request_off_without_an_answer() -> None:
    server = BackgroundSandbox(make_config(), graceful_shutdown_s=1).start()
    async with httpx.AsyncClient(base_url=server.url, timeout=60.0) as http:
        admin = SandboxClient(server.url, http)
        await admin.add_fault(rule("hang_after_effect", hang_ms=600_000))
        hanging = asyncio.create_task(http.post(CONTACTS, json=contact("jo@example.com")))
        await eventually(lambda: admin.ledger(), lambda entries: len(entries) == 1)

        started = time.monotonic()
        await asyncio.to_thread(server.stop)

        assert time.monotonic() - started < 5.0
        with pytest.raises(TRANSPORT_ERRORS):
            await hanging
