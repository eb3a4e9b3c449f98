"""The salesforce mode over real HTTP: flat bodies, error arrays, external ids, the org's
rolling allocation and Sforce-Limit-Info on every answer."""

from __future__ import annotations

import httpx
import pytest

from sandbox.config import SalesforceLimits
from sandbox.faults import FaultRuleSpec
from tests.sandbox.modes.conftest import (
    DATA,
    SF_ACCOUNTS,
    SF_CONTACTS,
    SF_LEGACY,
    SF_LOCATOR,
    TOKEN_B,
    Remote,
    auth,
)
from tests.sandbox.support import TRANSPORT_ERRORS

DAY_S = 86_400


def usage(answer: httpx.Response) -> str:
    return answer.headers["Sforce-Limit-Info"]


def error_codes(answer: httpx.Response) -> list[str]:
    """The codes of an error array (each item `{message, errorCode, fields}`)."""
    body = answer.json()
    assert isinstance(body, list)
    assert all(set(item) == {"message", "errorCode", "fields"} for item in body)
    return [item["errorCode"] for item in body]


async def test_create_answers_201_id_success_errors(salesforce: Remote) -> None:
    created = await salesforce.http.post(SF_CONTACTS + "/", json={"LastName": "Ng", "Age__c": 41})
    entries = await salesforce.admin.ledger("Contact", "create")

    assert created.status_code == 201
    body = created.json()
    assert body == {"id": body["id"], "success": True, "errors": []}
    assert len(body["id"]) == 18 and body["id"].startswith("003")
    assert usage(created) == "api-usage=1/15000"
    assert [e.object_id for e in entries] == [body["id"]]


async def test_a_record_reads_back_flat(salesforce: Remote) -> None:
    record_id = (
        await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng", "Age__c": 41})
    ).json()["id"]
    read = await salesforce.http.get(f"{SF_CONTACTS}/{record_id}")
    by_short_id = await salesforce.http.get(f"{SF_CONTACTS}/{record_id[:15]}")

    assert read.status_code == 200
    body = read.json()
    assert body["attributes"] == {"type": "Contact", "url": f"{SF_CONTACTS}/{record_id}"}
    assert (body["Id"], body["LastName"], body["Age__c"]) == (record_id, "Ng", 41)
    assert body["CreatedDate"].endswith("+0000")
    assert "properties" not in body
    assert by_short_id.json()["Id"] == record_id


async def test_an_update_answers_204_with_no_body(salesforce: Remote) -> None:
    record_id = (await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng"})).json()["id"]
    updated = await salesforce.http.patch(f"{SF_CONTACTS}/{record_id}", json={"LastName": "Ong"})
    read = await salesforce.http.get(f"{SF_CONTACTS}/{record_id}")
    [patch] = await salesforce.admin.ledger("Contact", "patch")

    assert (updated.status_code, updated.content) == (204, b"")
    assert usage(updated) == "api-usage=2/15000"
    assert read.json()["LastName"] == "Ong"
    assert (patch.object_id, patch.status) == (record_id, 204)


async def test_errors_are_arrays_of_error_code_message_fields(salesforce: Remote) -> None:
    await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng", SF_LOCATOR: "L-1"})
    duplicate = await salesforce.http.post(SF_CONTACTS, json={"LastName": "Po", SF_LOCATOR: "L-1"})
    unknown_id = await salesforce.http.get(f"{SF_CONTACTS}/003000000009999AAA")
    unknown_type = await salesforce.http.post(f"{DATA}/sobjects/Widget", json={})
    bad_json = await salesforce.http.post(SF_CONTACTS, content=b"{not json")
    nested = await salesforce.http.post(SF_CONTACTS, json={"LastName": {"a": 1}})

    assert (duplicate.status_code, error_codes(duplicate)) == (400, ["DUPLICATE_VALUE"])
    assert duplicate.json()[0]["fields"] == [SF_LOCATOR]
    assert (unknown_id.status_code, error_codes(unknown_id)) == (404, ["NOT_FOUND"])
    assert (unknown_type.status_code, error_codes(unknown_type)) == (404, ["NOT_FOUND"])
    assert (bad_json.status_code, error_codes(bad_json)) == (400, ["JSON_PARSER_ERROR"])
    assert (nested.status_code, error_codes(nested)) == (400, ["JSON_PARSER_ERROR"])
    assert len(await salesforce.admin.objects("Contact")) == 1
    assert all(usage(a).startswith("api-usage=") for a in (duplicate, unknown_id, bad_json))


async def test_external_id_look_ups_404_when_absent_300_when_not_unique(
    salesforce: Remote,
) -> None:
    first = (
        await salesforce.http.post(SF_ACCOUNTS, json={SF_LOCATOR: "A-1", SF_LEGACY: "x"})
    ).json()
    second = (
        await salesforce.http.post(SF_ACCOUNTS, json={SF_LOCATOR: "A-2", SF_LEGACY: "x"})
    ).json()
    found = await salesforce.http.get(f"{SF_ACCOUNTS}/{SF_LOCATOR}/A-1")
    absent = await salesforce.http.get(f"{SF_ACCOUNTS}/{SF_LOCATOR}/A-3")
    several = await salesforce.http.get(f"{SF_ACCOUNTS}/{SF_LEGACY}/x")
    not_external = await salesforce.http.get(f"{SF_ACCOUNTS}/Name/Acme")

    assert (found.status_code, found.json()["Id"]) == (200, first["id"])
    assert (absent.status_code, error_codes(absent)) == (404, ["NOT_FOUND"])
    assert several.status_code == 300
    assert several.json() == [f"{SF_ACCOUNTS}/{first['id']}", f"{SF_ACCOUNTS}/{second['id']}"]
    assert (not_external.status_code, error_codes(not_external)) == (404, ["NOT_FOUND"])


async def test_upsert_by_external_id(salesforce: Remote) -> None:
    created = await salesforce.http.patch(f"{SF_ACCOUNTS}/{SF_LOCATOR}/U-1", json={"Name": "A"})
    updated = await salesforce.http.patch(f"{SF_ACCOUNTS}/{SF_LOCATOR}/U-1", json={"Name": "B"})
    for locator in ("U-2", "U-3"):
        await salesforce.http.post(SF_ACCOUNTS, json={SF_LOCATOR: locator, SF_LEGACY: "y"})
    ambiguous = await salesforce.http.patch(f"{SF_ACCOUNTS}/{SF_LEGACY}/y", json={"Name": "C"})
    read = await salesforce.http.get(f"{SF_ACCOUNTS}/{SF_LOCATOR}/U-1")

    assert created.status_code == 201
    assert created.json() == {
        "id": created.json()["id"],
        "success": True,
        "errors": [],
        "created": True,
    }
    assert (updated.status_code, updated.json()["created"]) == (200, False)
    assert updated.json()["id"] == created.json()["id"]
    assert ambiguous.status_code == 300
    assert read.json()["Name"] == "B"


async def test_an_idempotency_key_is_ignored(salesforce: Remote) -> None:
    headers = {"Idempotency-Key": "k-1"}
    answers = [
        await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng"}, headers=headers)
        for _ in "ab"
    ]

    assert [a.status_code for a in answers] == [201, 201]
    assert answers[0].json()["id"] != answers[1].json()["id"]
    assert len(await salesforce.admin.objects("Contact")) == 2


async def test_a_spent_rolling_allocation_is_403_request_limit_exceeded(
    salesforce: Remote,
) -> None:
    """The org's allocation (every credential's) over a rolling 24 h: t=0 two requests,
    t=12 h one, then refused until t=0's two leave the window (not at a midnight)."""
    await salesforce.admin.set_limits(SalesforceLimits(allocation=3))
    at_0 = [await salesforce.http.get(f"{SF_CONTACTS}/1") for _ in "ab"]
    await salesforce.admin.advance_clock(DAY_S / 2)
    at_12h = await salesforce.http.get(f"{SF_CONTACTS}/1", headers=auth(TOKEN_B))
    refused = await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng"})
    await salesforce.admin.advance_clock(DAY_S / 2 - 60)
    still = await salesforce.http.get(f"{SF_CONTACTS}/1")
    await salesforce.admin.advance_clock(120)
    after = [await salesforce.http.get(f"{SF_CONTACTS}/1") for _ in "abc"]
    report = await salesforce.admin.limits()

    assert [usage(a) for a in at_0] == ["api-usage=1/3", "api-usage=2/3"]
    assert usage(at_12h) == "api-usage=3/3"
    assert (refused.status_code, error_codes(refused)) == (403, ["REQUEST_LIMIT_EXCEEDED"])
    assert usage(refused) == "api-usage=3/3"
    assert await salesforce.admin.ledger() == []  # refused before processing
    assert still.status_code == 403
    assert [a.status_code for a in after] == [404, 404, 403]
    assert report.refused == {"REQUEST_LIMIT_EXCEEDED": 3}


async def test_unable_to_lock_row_applies_nothing(salesforce: Remote) -> None:
    await salesforce.admin.add_fault(
        FaultRuleSpec(method="POST", path=SF_CONTACTS, action="status", status=400, times=1)
    )
    faulted = await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng"})
    await salesforce.admin.set_locked(True)
    locked = await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng"})
    await salesforce.admin.set_locked(False)
    nothing = await salesforce.admin.ledger()
    retried = await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng"})

    for answer in (faulted, locked):
        assert (answer.status_code, error_codes(answer)) == (400, ["UNABLE_TO_LOCK_ROW"])
    assert usage(faulted) == "api-usage=1/15000"  # a faulted answer carries it too
    assert nothing == []
    assert retried.status_code == 201


async def test_a_request_without_a_bearer_token_is_401_invalid_session_id(
    salesforce: Remote,
) -> None:
    async with httpx.AsyncClient(base_url=salesforce.url, timeout=5) as anonymous:
        answer = await anonymous.post(SF_CONTACTS, json={"LastName": "Ng"})

    assert (answer.status_code, error_codes(answer)) == (401, ["INVALID_SESSION_ID"])
    assert usage(answer) == "api-usage=0/15000"


async def test_faults_and_the_ledger_work_in_this_mode(salesforce: Remote) -> None:
    await salesforce.admin.add_fault(
        FaultRuleSpec(method="POST", path=SF_CONTACTS, action="reset_after_effect", times=1)
    )

    with pytest.raises(TRANSPORT_ERRORS):
        await salesforce.http.post(SF_CONTACTS, json={"LastName": "Ng", SF_LOCATOR: "R-1"})
    found = await salesforce.http.get(f"{SF_CONTACTS}/{SF_LOCATOR}/R-1")
    [entry] = await salesforce.admin.ledger("Contact", "create")

    assert found.json()["Id"] == entry.object_id
    assert entry.unique_values == {SF_LOCATOR: "R-1"}
