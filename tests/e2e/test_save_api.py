"""The HTTP save API (SPEC API-1, WF-2): decided and committed before the answer,
authenticated per client, idempotent per client key, bad input writes nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import free_port
from connector_push_client import SaveApiClient, SaveApiError, SaveIn
from db.migrate import apply_migrations
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.save_api_support import (
    AUTH,
    CRM_KEY,
    OTHER_AUTH,
    save_body,
    save_server,
    stored,
)
from tests.e2e.support import eventually

NOTHING = {"connector_push_attempt": 0, "connector_patch_dispatch": 0, "save_api_request": 0}


async def test_a_save_is_admitted_before_the_answer_and_a_repeat_observes_it(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    async with save_server(db_dsn) as live:
        first = await live.client.post("/v1/saves", json=save_body(), headers=AUTH)
        assert first.status_code == 200, first.text
        result = first.json()["result"]
        key = contact_key("c-001")
        assert result["decision"] == "create_reserved"
        assert result["linkKey"] == key and result["workflowId"] == f"link/{key}"
        # No Temporal configured: the wake-up is deferred to the relay, and said so.
        assert result["wake"] == "deferred" and first.json()["warnings"]
        row = await demo_db.fetchrow(
            "SELECT status FROM connector_push_attempt WHERE link_key = $1", key
        )
        assert row is not None and row["status"] == "pending"
        again = (await live.client.post("/v1/saves", json=save_body(), headers=AUTH)).json()
        assert again["result"]["decision"] == "observed_active_attempt"
        assert await stored(demo_db) == {**NOTHING, "connector_push_attempt": 1}


async def test_batch_answers_each_save_in_order(demo_db: asyncpg.Pool, db_dsn: str) -> None:
    saves = [
        save_body("c-001"),
        save_body("c-004"),
        save_body(
            "o-001",
            actionSlot="push-deal",
            destinationSlot="remote-deals",
            sourceObject="Opportunity",
        ),
    ]
    async with save_server(db_dsn) as live:
        response = await live.client.post("/v1/saves/batch", json={"saves": saves}, headers=AUTH)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["decision"] for r in results] == ["create_reserved", "rejected", "create_reserved"]
    assert results[1]["reason"] == "required_field_missing"  # c-004 has no Email
    assert await stored(demo_db) == {**NOTHING, "connector_push_attempt": 2}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong-key"},
        {"authorization": f"Basic {CRM_KEY}"},
        {"authorization": "Bearer"},
    ],
)
async def test_without_a_valid_bearer_key_it_is_401_and_nothing_is_written(
    demo_db: asyncpg.Pool, db_dsn: str, headers: dict[str, str]
) -> None:
    async with save_server(db_dsn) as live:
        response = await live.client.post("/v1/saves", json=save_body(), headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        batch = await live.client.post(
            "/v1/saves/batch", json={"saves": [save_body()]}, headers=headers
        )
        assert batch.status_code == 401
    assert await stored(demo_db) == NOTHING


BAD_SINGLE = [
    (save_body(recordId=" c-001"), "recordId"),
    (save_body(recordId=""), "recordId"),
    (save_body(sourceObject="Con\x00tact"), "sourceObject"),
    (save_body(actionSlot=7), "actionSlot"),
    (save_body(extra="x"), "extra"),
    ({k: v for k, v in save_body().items() if k != "ownerKey"}, "ownerKey"),
]


@pytest.mark.parametrize(("body", "path"), BAD_SINGLE)
async def test_bad_input_is_400_with_the_field_path_and_nothing_written(
    demo_db: asyncpg.Pool, db_dsn: str, body: dict[str, object], path: str
) -> None:
    async with save_server(db_dsn) as live:
        response = await live.client.post("/v1/saves", json=body, headers=AUTH)
        assert response.status_code == 400, response.text
        assert path in [f["path"] for f in response.json()["fields"]]
        batch = await live.client.post(
            "/v1/saves/batch", json={"saves": [save_body("c-002"), body]}, headers=AUTH
        )
        assert batch.status_code == 400  # one bad save refuses the whole batch
        assert f"saves.1.{path}" in [f["path"] for f in batch.json()["fields"]]
    assert await stored(demo_db) == NOTHING


async def test_malformed_oversized_and_too_many_are_refused(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    async with save_server(db_dsn) as live:
        post = live.client.post
        malformed = await post("/v1/saves", content=b"{not json", headers=AUTH)
        assert malformed.status_code == 400
        huge = save_body(userId="u" * 200)
        oversized = await post("/v1/saves/batch", json={"saves": [huge] * 60}, headers=AUTH)
        assert oversized.status_code == 413
        six = {"saves": [save_body(f"c-00{i}") for i in range(1, 7)]}  # max_batch is 5
        too_many = await post("/v1/saves/batch", json=six, headers=AUTH)
        assert too_many.status_code == 400 and too_many.json()["error"] == "batch_too_large"
        bad_key = await post(
            "/v1/saves", json=save_body(), headers={**AUTH, "idempotency-key": "x" * 300}
        )
        assert bad_key.status_code == 400
    assert await stored(demo_db) == NOTHING


def _with_record_id_twice(save: dict[str, object], second: str) -> str:
    """The save's JSON text with `recordId` given again at the end (last one wins in
    pydantic's own parser)."""
    return json.dumps(save)[:-1] + f', "recordId": "{second}"}}'


async def test_api1_a_key_given_twice_is_400_with_a_reason_and_nothing_written(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    """API-1 / NF-2: a body naming a field twice is ambiguous (which record was saved?),
    so it is refused as on every ingress endpoint, before anything is written."""
    single = _with_record_id_twice(save_body("c-001"), "c-002")
    batch = '{"saves": [' + _with_record_id_twice(save_body("c-001"), "c-002") + "]}"
    headers = {**AUTH, "content-type": "application/json"}
    async with save_server(db_dsn) as live:
        for path, body in (("/v1/saves", single), ("/v1/saves/batch", batch)):
            response = await live.client.post(path, content=body.encode(), headers=headers)
            assert response.status_code == 400, response.text
            assert response.json() == {
                "error": "invalid_request",
                "fields": [{"path": "", "message": "duplicate object key"}],
            }
    assert await stored(demo_db) == NOTHING


async def test_idempotency_key_replays_the_first_answer_per_client(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    headers = {**AUTH, "idempotency-key": "crm-req-1"}
    async with save_server(db_dsn) as live:
        first = await live.client.post("/v1/saves", json=save_body(), headers=headers)
        repeats = await asyncio.gather(
            *(live.client.post("/v1/saves", json=save_body(), headers=headers) for _ in range(3))
        )
        for repeat in repeats:
            assert repeat.status_code == 200
            assert repeat.headers["idempotent-replayed"] == "true"
            assert repeat.json()["replayed"] is True
            assert repeat.json()["result"]["decision"] == "create_reserved"
            assert repeat.json()["result"]["linkKey"] == first.json()["result"]["linkKey"]
        assert await stored(demo_db) == {
            **NOTHING,
            "connector_push_attempt": 1,
            "save_api_request": 1,
        }
        other_body = await live.client.post("/v1/saves", json=save_body("c-002"), headers=headers)
        assert other_body.status_code == 422
        # The key is the client's own: another client's same key is a new request.
        theirs = await live.client.post(
            "/v1/saves", json=save_body(), headers={**OTHER_AUTH, "idempotency-key": "crm-req-1"}
        )
        assert theirs.json()["result"]["decision"] == "observed_active_attempt"
        assert theirs.json()["replayed"] is False
    assert await stored(demo_db) == {**NOTHING, "connector_push_attempt": 1, "save_api_request": 2}


async def test_concurrent_first_requests_with_one_key_admit_once(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    body = {"saves": [save_body("c-001"), save_body("c-002")]}
    headers = {**AUTH, "idempotency-key": "race"}
    async with save_server(db_dsn) as live:
        answers = await asyncio.gather(
            *(live.client.post("/v1/saves/batch", json=body, headers=headers) for _ in range(4))
        )
    assert all(a.status_code == 200 for a in answers)
    decisions = {tuple(r["decision"] for r in a.json()["results"]) for a in answers}
    assert decisions == {("create_reserved", "create_reserved")}
    assert sum(not a.json()["replayed"] for a in answers) == 1
    assert await stored(demo_db) == {**NOTHING, "connector_push_attempt": 2, "save_api_request": 1}


async def test_openapi_document_describes_both_routes(demo_db: asyncpg.Pool, db_dsn: str) -> None:
    async with save_server(db_dsn) as live:
        document = (await live.client.get("/openapi.json")).json()
    assert set(document["paths"]) == {"/v1/saves", "/v1/saves/batch"}
    schemas = document["components"]["schemas"]
    assert {"SaveIn", "SaveBatchIn", "SaveAnswer", "BatchAnswer", "ErrorAnswer"} <= set(schemas)
    assert "recordId" in schemas["SaveIn"]["properties"]
    json.dumps(document)


async def test_python_client_saves_and_the_woken_workflow_creates_once(
    stack: Stack, db_dsn: str
) -> None:
    """With Temporal configured the answer says `signalled`, and the push completes."""
    async with save_server(db_dsn, temporal=(stack.client, stack.task_queue)) as live:
        stack.touched.add(contact_key("c-001"))
        async with SaveApiClient(live.base_url, CRM_KEY) as api:
            save = SaveIn.model_validate(save_body())
            answer = await api.save(save, idempotency_key="py-1")
            assert answer.result.decision == "create_reserved"
            assert answer.result.wake == "signalled" and not answer.warnings
            assert (await api.save(save, idempotency_key="py-1")).replayed
            with pytest.raises(SaveApiError) as refused:
                await api.save(save.model_copy(update={"record_id": "c-002"}), "py-1")
            assert refused.value.status == 422
    attempt = await eventually(
        lambda: stack.attempt(contact_key("c-001")), lambda a: a["status"] == "finalized"
    )
    ledger = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.object_id for e in ledger] == [attempt["remote_id"]]


async def test_client_raises_retryable_error_on_401(db_dsn: str, demo_db: asyncpg.Pool) -> None:
    async with save_server(db_dsn) as live, SaveApiClient(live.base_url, "nope") as api:
        with pytest.raises(SaveApiError) as refused:
            await api.save_batch([SaveIn.model_validate(save_body())])
    assert refused.value.status == 401 and not refused.value.retryable


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A Postgres server of this test's own, so the test may stop it."""
    root = Path(tempfile.mkdtemp(prefix="cp-pg-saves-"))
    server = EmbeddedPostgres(root / "data", "127.0.0.1", free_port(), durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_postgres_stopped_is_503_with_retry_after(own_postgres: EmbeddedPostgres) -> None:
    dsn = own_postgres.dsn("postgres")
    await apply_migrations(dsn)
    async with save_server(dsn) as live:
        first = await live.client.post("/v1/saves", json=save_body(), headers=AUTH)
        assert first.status_code == 200  # no pack here: a committed `rejected` decision
        assert first.json()["result"]["decision"] == "rejected"
        await asyncio.to_thread(own_postgres.stop)
        for route, body in (
            ("/v1/saves", save_body()),
            ("/v1/saves/batch", {"saves": [save_body()]}),
        ):
            response = await live.client.post(
                route, json=body, headers={**AUTH, "idempotency-key": "k"}
            )
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"]
            assert response.json()["error"] == "database_unavailable"
