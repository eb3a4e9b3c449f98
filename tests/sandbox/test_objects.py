"""Objects API through real HTTP: shape, 404s, unique values, lookup, idempotency keys."""

from __future__ import annotations

import hashlib

import httpx

from sandbox.client import SandboxClient
from tests.sandbox.support import COMPANIES, CONTACTS, LOCATOR, contact


async def test_create_answers_201_in_hubspot_shape_and_get_reads_it(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    created = await http.post(CONTACTS, json=contact("ann@example.com", firstname="Ann"))

    assert created.status_code == 201
    body = created.json()
    assert body["id"].isdigit()
    assert body["archived"] is False
    assert body["properties"]["firstname"] == "Ann"
    read = await http.get(f"{CONTACTS}/{body['id']}")
    assert read.status_code == 200
    assert read.json() == body


async def test_unknown_id_is_404_object_not_found_for_get_patch_delete(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    answers = [
        await http.get(f"{CONTACTS}/999999"),
        await http.patch(f"{CONTACTS}/999999", json=contact("x@example.com")),
        await http.delete(f"{CONTACTS}/999999"),
    ]

    assert [a.status_code for a in answers] == [404, 404, 404]
    assert all(a.json()["category"] == "OBJECT_NOT_FOUND" for a in answers)
    assert all(a.json()["status"] == "error" for a in answers)


async def test_same_idempotency_key_and_body_replays_the_first_response(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    headers = {"Idempotency-Key": "attempt-1"}
    first = await http.post(CONTACTS, json=contact("bo@example.com"), headers=headers)
    second = await http.post(CONTACTS, json=contact("bo@example.com"), headers=headers)

    assert (first.status_code, second.status_code) == (201, 201)
    assert second.json() == first.json()
    assert len(await sandbox.objects("contacts")) == 1
    ledger = await sandbox.ledger("contacts", "create")
    assert [(e.replayed, e.idempotency_key) for e in ledger] == [
        (False, "attempt-1"),
        (True, "attempt-1"),
    ]
    assert ledger[0].object_id == ledger[1].object_id == first.json()["id"]


async def test_same_idempotency_key_with_a_different_body_is_422(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    headers = {"Idempotency-Key": "attempt-2"}
    await http.post(CONTACTS, json=contact("cy@example.com"), headers=headers)
    reused = await http.post(CONTACTS, json=contact("other@example.com"), headers=headers)

    assert reused.status_code == 422
    assert len(await sandbox.objects("contacts")) == 1


async def test_idempotency_key_is_ignored_where_not_configured(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    headers = {"Idempotency-Key": "attempt-3"}
    first = await http.post(COMPANIES, json={"properties": {"name": "Acme"}}, headers=headers)
    second = await http.post(COMPANIES, json={"properties": {"name": "Acme"}}, headers=headers)

    assert first.json()["id"] != second.json()["id"]
    ledger = await sandbox.ledger("companies")
    assert [(e.idempotency_key, e.replayed) for e in ledger] == [("attempt-3", False)] * 2


async def test_duplicate_unique_value_is_409_carrying_the_existing_id(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    existing = (await http.post(CONTACTS, json=contact("dee@example.com"))).json()["id"]
    duplicate = await http.post(CONTACTS, json=contact("dee@example.com"))

    assert duplicate.status_code == 409
    assert duplicate.json()["message"] == f"Contact already exists. Existing ID: {existing}"
    assert duplicate.json()["category"] == "CONFLICT"
    assert len(await sandbox.ledger("contacts", "create")) == 1


async def test_duplicate_locator_property_is_409_with_existing_id(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    body = {"properties": {"name": "Acme", LOCATOR: "link-1"}}
    existing = (await http.post(COMPANIES, json=body)).json()["id"]
    duplicate = await http.post(COMPANIES, json=body)

    assert duplicate.status_code == 409
    assert duplicate.json()["message"].endswith(f"Existing ID: {existing}")


async def test_patch_into_a_taken_unique_value_is_409_and_ledgered(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    first = (await http.post(CONTACTS, json=contact("eve@example.com"))).json()["id"]
    second = (await http.post(CONTACTS, json=contact("fay@example.com"))).json()["id"]

    clash = await http.patch(f"{CONTACTS}/{second}", json=contact("eve@example.com"))
    same = await http.patch(f"{CONTACTS}/{first}", json=contact("eve@example.com", lastname="E"))

    assert clash.status_code == 409
    assert f"Existing ID: {first}" in clash.json()["message"]
    assert same.status_code == 200
    assert same.json()["properties"]["lastname"] == "E"
    patches = await sandbox.ledger("contacts", "patch")
    assert [(p.object_id, p.status) for p in patches] == [(second, 409), (first, 200)]


async def test_lookup_by_unique_id_property(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    created = await http.post(CONTACTS, json=contact("gus@example.com", **{LOCATOR: "link-9"}))

    by_locator = await http.get(f"{CONTACTS}/link-9", params={"idProperty": LOCATOR})
    by_email = await http.get(f"{CONTACTS}/gus@example.com", params={"idProperty": "email"})
    missing = await http.get(f"{CONTACTS}/link-0", params={"idProperty": LOCATOR})
    not_unique = await http.get(f"{CONTACTS}/Gus", params={"idProperty": "firstname"})

    assert by_locator.json()["id"] == by_email.json()["id"] == created.json()["id"]
    assert (missing.status_code, not_unique.status_code) == (404, 400)


async def test_delete_forgets_the_object_and_frees_its_unique_value(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    object_id = (await http.post(CONTACTS, json=contact("hal@example.com"))).json()["id"]

    deleted = await http.delete(f"{CONTACTS}/{object_id}")

    assert deleted.status_code == 204
    assert (await http.get(f"{CONTACTS}/{object_id}")).status_code == 404
    assert (await http.post(CONTACTS, json=contact("hal@example.com"))).status_code == 201
    assert [e.kind for e in await sandbox.ledger("contacts")] == ["create", "delete", "create"]


async def test_patch_moves_a_unique_value_the_old_one_is_free_and_the_new_one_found(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    object_id = (await http.post(CONTACTS, json=contact("ida@example.com"))).json()["id"]

    moved = await http.patch(f"{CONTACTS}/{object_id}", json=contact("ivo@example.com"))

    assert moved.status_code == 200
    by_new = await http.get(f"{CONTACTS}/ivo@example.com", params={"idProperty": "email"})
    by_old = await http.get(f"{CONTACTS}/ida@example.com", params={"idProperty": "email"})
    assert (by_new.json()["id"], by_old.status_code) == (object_id, 404)
    assert (await http.post(CONTACTS, json=contact("ida@example.com"))).status_code == 201
    clash = await http.post(CONTACTS, json=contact("ivo@example.com"))
    assert clash.status_code == 409
    assert clash.json()["message"].endswith(f"Existing ID: {object_id}")


async def test_reset_frees_every_unique_value(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    assert (await http.post(CONTACTS, json=contact("jo@example.com"))).status_code == 201

    await sandbox.reset()

    found = await http.get(f"{CONTACTS}/jo@example.com", params={"idProperty": "email"})
    assert found.status_code == 404
    assert (await http.post(CONTACTS, json=contact("jo@example.com"))).status_code == 201


async def test_bad_requests_are_400_and_leave_no_trace(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    answers = [
        await http.post("/crm/v3/objects/unicorns", json={"properties": {}}),
        await http.post(CONTACTS, content=b"{not json"),
        await http.post(CONTACTS, json={"props": {}}),
        await http.post(CONTACTS, json={"properties": {"email": {"nested": 1}}}),
    ]

    assert [a.status_code for a in answers] == [400, 400, 400, 400]
    assert await sandbox.ledger() == []


async def test_ledger_records_body_hash_and_unique_values(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    raw = b'{"properties": {"email": "ivy@example.com", "cp_locator": "link-5"}}'
    headers = {"content-type": "application/json", "Idempotency-Key": "k-5"}
    created = await http.post(CONTACTS, content=raw, headers=headers)

    [entry] = await sandbox.ledger()
    assert entry.seq == 1
    assert entry.kind == "create"
    assert entry.object_id == created.json()["id"]
    assert entry.body_sha256 == hashlib.sha256(raw).hexdigest()
    assert entry.unique_values == {"email": "ivy@example.com", LOCATOR: "link-5"}
    assert entry.idempotency_key == "k-5"


async def test_etag_changes_on_patch_and_a_stale_if_match_is_412_with_nothing_changed(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    created = await http.post(CONTACTS, json=contact("eve@example.com", firstname="Eve"))
    object_id, first = created.json()["id"], created.headers["etag"]
    fresh = await http.patch(
        f"{CONTACTS}/{object_id}",
        json=contact("eve@example.com", firstname="Evelyn"),
        headers={"If-Match": first},
    )
    assert fresh.status_code == 200 and fresh.headers["etag"] != first
    stale = await http.patch(
        f"{CONTACTS}/{object_id}",
        json=contact("eve@example.com", firstname="Mallory"),
        headers={"If-Match": first},
    )
    assert stale.status_code == 412
    read = await http.get(f"{CONTACTS}/{object_id}")
    assert read.json()["properties"]["firstname"] == "Evelyn"
    assert read.headers["etag"] == fresh.headers["etag"]
