"""SPEC S-1: a save API client acts only for the owners (and, where listed, the users) its
policy entry names, and only for records the store holds for that owner; anything else
is a 403 with a reason and nothing written (no attempt, no queued PATCH, no idempotency
record), for a single save and for a whole batch with one save at fault.

A real ingress on a real socket over the demo pack and records in Postgres.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from ingress.config import ConfigError, parse_policy
from services.record_loader import load_records, parse_records_document
from tests.e2e.conftest import OWNER
from tests.e2e.save_api_support import AUTH, OTHER_AUTH, save_api_config, save_body, stored
from tests.ingress.support import Live, live_server, policy_document

NOTHING = {"connector_push_attempt": 0, "connector_patch_dispatch": 0, "save_api_request": 0}
TENANT_B = "tenant-b"
# `crm` saves for the demo owner, as any of its users; `other` for tenant B only, and
# only as bob (the CRM delegates: it names the users it may act for).
SCOPED_CLIENTS = [
    {"name": "crm", "key_env": "TEST_SAVE_KEY_CRM", "owners": [OWNER]},
    {"name": "other", "key_env": "TEST_SAVE_KEY_OTHER", "owners": [TENANT_B], "users": ["bob"]},
]


@pytest.fixture
async def live(demo_db: asyncpg.Pool, db_dsn: str) -> AsyncIterator[Live]:
    async with live_server(save_api_config(clients=SCOPED_CLIENTS), db_dsn) as server:
        yield server


async def post(
    live: Live, body: dict[str, Any], auth: dict[str, str], batch: bool = False
) -> httpx.Response:
    """With an Idempotency-Key, so a refusal that stored one would show in `stored`."""
    route = "/v1/saves/batch" if batch else "/v1/saves"
    headers = {**auth, "idempotency-key": f"k-{len(str(body))}-{batch}"}
    return await live.client.post(route, json=body, headers=headers)


def refusal(answer: httpx.Response) -> tuple[int, str, list[str]]:
    body = answer.json()
    return answer.status_code, body["error"], [f["path"] for f in body["fields"]]


async def test_s1_a_save_for_another_owner_is_403_with_nothing_written(
    live: Live, demo_db: asyncpg.Pool
) -> None:
    """Client `crm` names tenant B's owner key: before S-1 it was admitted on B's quota
    and through B's pack; now it is refused, naming the field, and nothing is stored."""
    answer = await post(live, save_body("c-001", ownerKey=TENANT_B), AUTH)

    assert refusal(answer) == (403, "forbidden", ["ownerKey"])
    assert "client crm may not save for this owner" in answer.json()["fields"][0]["message"]
    assert await stored(demo_db) == NOTHING


async def test_s1_a_user_outside_a_delegating_clients_users_is_403(
    live: Live, demo_db: asyncpg.Pool
) -> None:
    """`other` lists its users: naming alice (the user with the widest field access, as an
    attacker would) or no user at all is refused; its own owner with bob passes the scope."""
    for user in ({"userId": "alice"}, {"userId": None}):
        body = save_body("c-001", ownerKey=TENANT_B, **user)
        answer = await post(live, {k: v for k, v in body.items() if v is not None}, OTHER_AUTH)
        assert refusal(answer) == (403, "forbidden", ["userId"])
    assert await stored(demo_db) == NOTHING


async def test_s1_a_batch_with_one_save_out_of_scope_is_refused_whole(
    live: Live, demo_db: asyncpg.Pool
) -> None:
    """Fail closed: one save outside the scope refuses the batch, naming it by index; the
    saves within it are not admitted either (no partial batch, nothing written)."""
    saves = [save_body("c-001"), save_body("c-002", ownerKey=TENANT_B), save_body("c-003")]

    answer = await post(live, {"saves": saves}, AUTH, batch=True)

    assert refusal(answer) == (403, "forbidden", ["saves.1.ownerKey"])
    assert await stored(demo_db) == NOTHING


async def test_s1_a_record_held_for_another_owner_or_none_is_403_with_nothing_written(
    live: Live, demo_db: asyncpg.Pool
) -> None:
    """The store knows each record's owner: a save in the client's own name for a record
    of tenant B, or for a record loaded without an owner, is refused (single and batch)."""
    async with demo_db.acquire() as conn:
        await load_records(
            conn,
            parse_records_document(
                {
                    "records": [
                        {"object": "Contact", "id": "b-1", "fields": {}, "owner": TENANT_B},
                        {"object": "Contact", "id": "none-1", "fields": {}},
                    ]
                }
            ),
        )

    for record_id, held in (("b-1", "belongs to another owner"), ("none-1", "has no owner")):
        answer = await post(live, save_body(record_id), AUTH)
        assert refusal(answer) == (403, "record_owner_mismatch", ["recordId"])
        assert held in answer.json()["fields"][0]["message"]
    batch = {"saves": [save_body("c-001"), save_body("b-1")]}
    answer = await post(live, batch, AUTH, batch=True)
    assert refusal(answer) == (403, "record_owner_mismatch", ["saves.1.recordId"])
    assert await stored(demo_db) == NOTHING

    # The same client, its own owner's record: admitted (the refusals above are the scope's).
    answer = await post(live, save_body("c-001"), AUTH)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["decision"] == "create_reserved"


@pytest.mark.parametrize(
    ("client", "setting"),
    [
        ({"name": "crm", "key_env": "K"}, "save_api.clients.0.owners: Field required"),
        ({"name": "crm", "key_env": "K", "owners": []}, "save_api.clients.0.owners"),
        ({"name": "crm", "key_env": "K", "owners": ["o"], "users": []}, "save_api.clients.0.users"),
        ({"name": "crm", "key_env": "K", "owners": [" o"]}, "save_api.clients.0.owners"),
    ],
)
def test_s1_a_client_without_owners_refuses_to_start_naming_the_setting(
    client: dict[str, Any], setting: str
) -> None:
    """Decision: a policy written before S-1 (no `owners`) fails closed at start, naming
    the setting, rather than serving a client that could save for no one, or anyone."""
    document = policy_document(save_api={"clients": [client]})
    with pytest.raises(ConfigError, match=setting):
        parse_policy(yaml.safe_dump(document))


async def test_s1_records_load_sets_and_keeps_the_records_owner(db_pool: asyncpg.Pool) -> None:
    """`records load`: a record's own `owner`, else the document's; a reload naming none
    keeps the stored owner, and one naming another moves it (a new version)."""

    async def owners() -> dict[str, tuple[str | None, int]]:
        rows = await db_pool.fetch("SELECT record_id, owner_key, version FROM crm_record")
        return {r["record_id"]: (r["owner_key"], r["version"]) for r in rows}

    first = {
        "owner": OWNER,
        "records": [
            {"object": "Contact", "id": "r-1", "fields": {"A": 1}},
            {"object": "Contact", "id": "r-2", "fields": {"A": 1}, "owner": TENANT_B},
        ],
    }
    async with db_pool.acquire() as conn:
        await load_records(conn, parse_records_document(first))
        assert await owners() == {"r-1": (OWNER, 1), "r-2": (TENANT_B, 1)}
        unnamed = {"records": [{"object": "Contact", "id": "r-1", "fields": {"A": 1}}]}
        summary = await load_records(conn, parse_records_document(unnamed))
        assert summary.records_written == 0
        assert await owners() == {"r-1": (OWNER, 1), "r-2": (TENANT_B, 1)}
        moved = {"owner": TENANT_B, "records": unnamed["records"]}
        await load_records(conn, parse_records_document(moved))
        assert (await owners())["r-1"] == (TENANT_B, 2)
