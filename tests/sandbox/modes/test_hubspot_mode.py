"""The hubspot mode over real HTTP: what HubSpot's CRM objects API documents, nothing more."""

from __future__ import annotations

import httpx
import pytest

from sandbox.config import DailyLimit, HubSpotLimits, RateLimitConfig
from sandbox.faults import FaultRuleSpec
from sandbox.front_door import fingerprint
from tests.sandbox.modes.conftest import CONTACTS, LOCATOR, TOKEN_A, TOKEN_B, Remote, auth
from tests.sandbox.support import TRANSPORT_ERRORS

ERROR_KEYS = {"status", "message", "correlationId", "category"}
OBJECT_KEYS = {"id", "properties", "createdAt", "updatedAt", "archived"}


def contact(email: str, **extra: str) -> dict[str, object]:
    return {"properties": {"email": email, **extra}}


def burst(requests: int) -> HubSpotLimits:
    return HubSpotLimits(burst=RateLimitConfig(requests=requests, per_seconds=10), daily=None)


async def test_an_idempotency_key_is_ignored_so_the_same_post_is_two_objects(
    hubspot: Remote,
) -> None:
    headers = {"Idempotency-Key": "k-1"}
    body = {"properties": {"name": "Acme"}}
    first = await hubspot.http.post("/crm/v3/objects/companies", json=body, headers=headers)
    second = await hubspot.http.post("/crm/v3/objects/companies", json=body, headers=headers)
    ledger = await hubspot.admin.ledger("companies", "create")

    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    assert "Idempotent-Replayed" not in second.headers
    assert [(e.idempotency_key, e.replayed) for e in ledger] == [("k-1", False), ("k-1", False)]


async def test_objects_have_hubspots_shape_and_no_etag(hubspot: Remote) -> None:
    created = await hubspot.http.post(CONTACTS, json=contact("ann@example.com"))
    read = await hubspot.http.get(f"{CONTACTS}/{created.json()['id']}")

    for answer in (created, read):
        assert set(answer.json()) == OBJECT_KEYS
        assert "etag" not in answer.headers
    assert read.json()["properties"]["email"] == "ann@example.com"
    assert read.json()["archived"] is False


async def test_a_stale_if_match_is_not_a_precondition(hubspot: Remote) -> None:
    created = (await hubspot.http.post(CONTACTS, json=contact("bo@example.com"))).json()

    patched = await hubspot.http.patch(
        f"{CONTACTS}/{created['id']}", json=contact("bo2@example.com"), headers={"If-Match": '"0"'}
    )

    assert patched.status_code == 200
    assert "etag" not in patched.headers
    assert patched.json()["properties"]["email"] == "bo2@example.com"


async def test_a_duplicate_email_is_409_existing_id_in_hubspots_error_body(
    hubspot: Remote,
) -> None:
    created = (await hubspot.http.post(CONTACTS, json=contact("cy@example.com"))).json()
    duplicates = [await hubspot.http.post(CONTACTS, json=contact("cy@example.com")) for _ in "ab"]
    objects = await hubspot.admin.objects("contacts")

    assert [d.status_code for d in duplicates] == [409, 409]
    body = duplicates[0].json()
    assert set(body) == ERROR_KEYS
    assert body["message"] == f"Contact already exists. Existing ID: {created['id']}"
    assert (body["status"], body["category"]) == ("error", "CONFLICT")
    assert body["correlationId"] != duplicates[1].json()["correlationId"]
    assert len(objects) == 1


async def test_id_property_look_ups(hubspot: Remote) -> None:
    created = await hubspot.http.post(CONTACTS, json=contact("di@example.com", **{LOCATOR: "L-1"}))
    by_locator = await hubspot.http.get(f"{CONTACTS}/L-1", params={"idProperty": LOCATOR})
    absent = await hubspot.http.get(f"{CONTACTS}/L-2", params={"idProperty": LOCATOR})
    not_unique = await hubspot.http.get(f"{CONTACTS}/Di", params={"idProperty": "firstname"})

    assert by_locator.status_code == 200
    assert by_locator.json()["id"] == created.json()["id"]
    assert (absent.status_code, set(absent.json())) == (404, ERROR_KEYS)
    assert (not_unique.status_code, not_unique.json()["category"]) == (400, "VALIDATION_ERROR")


async def test_a_request_without_a_bearer_token_is_401_and_applies_nothing(
    hubspot: Remote,
) -> None:
    async with httpx.AsyncClient(base_url=hubspot.url, timeout=5) as anonymous:
        answer = await anonymous.post(CONTACTS, json=contact("eve@example.com"))

    assert answer.status_code == 401
    assert set(answer.json()) == ERROR_KEYS
    assert answer.json()["category"] == "INVALID_AUTHENTICATION"
    assert await hubspot.admin.ledger() == []


async def test_the_burst_limit_is_per_credential_with_no_tolerance(hubspot: Remote) -> None:
    await hubspot.admin.set_limits(burst(5))
    a = [await hubspot.http.post(CONTACTS, json=contact(f"a{i}@example.com")) for i in range(7)]
    b_headers = auth(TOKEN_B)
    b = [
        await hubspot.http.post(CONTACTS, json=contact(f"b{i}@example.com"), headers=b_headers)
        for i in range(6)
    ]
    report = await hubspot.admin.limits()

    assert [r.status_code for r in a] == [201] * 5 + [429] * 2
    assert [r.status_code for r in b] == [201] * 5 + [429]
    refused = a[5].json()
    assert set(refused) >= ERROR_KEYS
    assert (refused["policyName"], refused["category"]) == ("TEN_SECONDLY_ROLLING", "RATE_LIMITS")
    assert 1 <= int(a[5].headers["Retry-After"]) <= 10
    assert [r.headers["X-HubSpot-RateLimit-Remaining"] for r in a[:5]] == ["4", "3", "2", "1", "0"]
    assert len(await hubspot.admin.ledger("contacts", "create")) == 10  # refusals applied nothing
    assert report.refused == {"TEN_SECONDLY_ROLLING": 3}
    assert [x.credential for x in report.admitted] == [fingerprint(TOKEN_A)] * 5 + [
        fingerprint(TOKEN_B)
    ] * 5


async def test_the_burst_window_slides_on_the_sandbox_clock(hubspot: Remote) -> None:
    """Arrivals at t=0 (two), t=5 (one fits) and t=10.5 (t=0's two have left: two fit)."""
    await hubspot.admin.set_limits(burst(3))

    async def sends(n: int) -> list[int]:
        return [(await hubspot.http.get(f"{CONTACTS}/1")).status_code for _ in range(n)]

    at_0 = await sends(2)
    await hubspot.admin.advance_clock(5)
    at_5 = await sends(2)
    await hubspot.admin.advance_clock(5.5)
    at_10_5 = await sends(3)

    assert at_0 == [404, 404]  # admitted: the object does not exist
    assert at_5 == [404, 429]
    assert at_10_5 == [404, 404, 429]


async def test_the_daily_limit_is_the_accounts_and_names_daily(hubspot: Remote) -> None:
    await hubspot.admin.set_limits(HubSpotLimits(burst=None, daily=DailyLimit(requests=3)))
    admitted = [
        await hubspot.http.get(f"{CONTACTS}/1", headers=auth(token))
        for token in (TOKEN_A, TOKEN_A, TOKEN_B)
    ]
    refused = await hubspot.http.get(f"{CONTACTS}/1", headers=auth(TOKEN_B))
    await hubspot.admin.advance_clock(int(refused.headers["Retry-After"]) + 1)
    next_day = await hubspot.http.get(f"{CONTACTS}/1")

    assert [r.status_code for r in admitted] == [404, 404, 404]
    assert admitted[2].headers["X-HubSpot-RateLimit-Daily-Remaining"] == "0"
    assert refused.status_code == 429
    assert (refused.json()["policyName"], set(refused.json()) >= ERROR_KEYS) == ("DAILY", True)
    assert 0 < int(refused.headers["Retry-After"]) <= 86_400
    assert next_day.status_code == 404


async def test_locked_is_423_and_applies_nothing(hubspot: Remote) -> None:
    await hubspot.admin.set_locked(True)
    locked = await hubspot.http.post(CONTACTS, json=contact("fay@example.com"))
    await hubspot.admin.set_locked(False)
    await hubspot.admin.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="status", status=423, times=1)
    )
    faulted = await hubspot.http.post(CONTACTS, json=contact("fay@example.com"))
    nothing = await hubspot.admin.ledger()
    retried = await hubspot.http.post(CONTACTS, json=contact("fay@example.com"))

    for answer in (locked, faulted):
        assert answer.status_code == 423
        assert set(answer.json()) == ERROR_KEYS
        assert answer.json()["category"] == "LOCKED"
    assert nothing == []
    assert retried.status_code == 201


async def test_faults_and_the_ledger_work_in_this_mode(hubspot: Remote) -> None:
    await hubspot.admin.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, action="reset_after_effect", times=1)
    )
    await hubspot.admin.add_fault(
        FaultRuleSpec(method="GET", path=f"{CONTACTS}/*", action="status", status=429, times=1)
    )

    with pytest.raises(TRANSPORT_ERRORS):
        await hubspot.http.post(CONTACTS, json=contact("gus@example.com", **{LOCATOR: "L-9"}))
    throttled = await hubspot.http.get(f"{CONTACTS}/L-9", params={"idProperty": LOCATOR})
    found = await hubspot.http.get(f"{CONTACTS}/L-9", params={"idProperty": LOCATOR})
    [entry] = await hubspot.admin.ledger("contacts", "create")

    assert throttled.json()["policyName"] == "TEN_SECONDLY_ROLLING"
    assert set(throttled.json()) >= ERROR_KEYS
    assert found.json()["id"] == entry.object_id
    assert entry.unique_values == {"email": "gus@example.com", LOCATOR: "L-9"}


async def test_callbacks_are_answered_and_kept(hubspot: Remote) -> None:
    body = {"outputFields": {"hs_execution_state": "SUCCESS"}}
    answer = await hubspot.http.post("/automation/v4/actions/callbacks/cb-1/complete", json=body)

    assert answer.status_code == 204
    assert [c.callback_id for c in await hubspot.admin.callbacks()] == ["cb-1"]
