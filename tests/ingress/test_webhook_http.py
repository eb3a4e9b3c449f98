"""Ordinary webhooks over a real uvicorn server and a real database (ING-1..5)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from ingress.app import wall_clock_ms
from tests.ingress.support import (
    NOTHING_STORED,
    Live,
    counts,
    encode,
    event,
    live_server,
    make_config,
    signed_headers,
)

PATH = "/webhooks/crm"


@pytest.fixture
async def live(db_dsn: str) -> AsyncIterator[Live]:
    async with live_server(make_config(), db_dsn) as server:
        yield server


async def post(live: Live, body: bytes, path: str = PATH, **kwargs: object) -> httpx.Response:
    headers = signed_headers(body, path, **kwargs)  # type: ignore[arg-type]
    return await live.client.post(path, content=body, headers=headers)


async def test_signed_batch_is_admitted_then_acknowledged(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    body = encode([event(1), event(2, subscriptionType="contact.creation")])
    response = await post(live, body)
    assert response.status_code == 202
    receipts = response.json()["receipts"]
    assert receipts[0]["eventId"] is not None and receipts[1]["eventId"] is None
    async with db_pool.acquire() as conn:
        stored = await conn.fetch("SELECT receipt_id, event_id FROM ingress_receipt")
        events = await conn.fetch("SELECT event_id, handler, status FROM connector_event")
    assert {(r["receipt_id"], r["event_id"]) for r in stored} == {
        (r["receiptId"], r["eventId"]) for r in receipts
    }
    assert [(e["event_id"], e["handler"], e["status"]) for e in events] == [
        (receipts[0]["eventId"], "remote_deletion", "admitted")
    ]


async def test_retry_in_a_different_batch_adds_receipts_not_events(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    first = await post(live, encode([event(1), event(2), event(3)]))
    assert first.status_code == 202
    retry = await post(live, encode([event(3, attempt=1), event(4), event(1, attempt=1)]))
    assert retry.status_code == 202
    assert await counts(db_pool) == {
        "ingress_receipt": 6,
        "connector_event": 4,
        "workflow_action_execution": 0,
    }
    again = await post(live, encode([event(1, attempt=1)]))  # same transport attempt: no-op
    assert again.json()["receipts"] == [retry.json()["receipts"][2]]
    assert (await counts(db_pool))["ingress_receipt"] == 6


async def test_two_distinct_events_sharing_an_event_id_are_two_events(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    response = await post(live, encode([event(5, object_id=1), event(5, object_id=2)]))
    assert response.status_code == 202
    assert (await counts(db_pool))["connector_event"] == 2


async def test_numeric_forms_of_one_value_are_one_event(live: Live, db_pool: asyncpg.Pool) -> None:
    template = encode([event(1)]).decode()
    for form in ("1", "1.0", "1e0"):
        body = template.replace('"eventId": 1', f'"eventId": {form}').encode()
        assert (await post(live, body)).status_code == 202
    assert (await counts(db_pool))["connector_event"] == 1


@pytest.mark.parametrize(
    ("mutate", "status"),
    [
        ("wrong_secret", 401),
        ("tampered", 401),
        ("stale", 401),
        ("future", 401),
        ("unsigned", 401),
    ],
)
async def test_bad_signatures_are_401_and_store_nothing(
    live: Live, db_pool: asyncpg.Pool, mutate: str, status: int
) -> None:
    body = encode([event(1)])
    now = wall_clock_ms()
    headers = {
        "wrong_secret": signed_headers(body, PATH, secret="nope"),
        "tampered": signed_headers(encode([event(2)]), PATH),
        "stale": signed_headers(body, PATH, timestamp_ms=now - 301_000),
        "future": signed_headers(body, PATH, timestamp_ms=now + 120_000),
        "unsigned": {"content-type": "application/json"},
    }[mutate]
    response = await live.client.post(PATH, content=body, headers=headers)
    assert response.status_code == status
    assert await counts(db_pool) == NOTHING_STORED


async def test_uri_with_encoded_characters_and_non_ascii_body(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    path = PATH + "?tag=a%3Ab%2Cc&name=%C3%A4"
    body = encode(
        [
            event(
                1,
                subscriptionType="contact.propertyChange",
                propertyName="city",
                propertyValue="Zürich \u00e4",
            )
        ]
    )
    # The sender signs the decoded form of the escapes the scheme lists.
    headers = signed_headers(body, PATH + "?tag=a:b,c&name=%C3%A4")
    response = await live.client.post(path, content=body, headers=headers)
    assert response.status_code == 202
    async with db_pool.acquire() as conn:
        payload = await conn.fetchval("SELECT payload FROM connector_event")
    assert "Zürich ä" in payload


async def test_the_host_header_does_not_change_the_signed_uri(live: Live) -> None:
    body = encode([event(1)])
    headers = {**signed_headers(body, PATH), "host": "attacker.example"}
    assert (await live.client.post(PATH, content=body, headers=headers)).status_code == 202


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"[{", 400), (b"[]", 400), (b"[1]", 400), (b'[{"eventId": 1}]', 400), (b"{}", 400)],
)
async def test_malformed_bodies_are_400_and_store_nothing(
    live: Live, db_pool: asyncpg.Pool, body: bytes, status: int
) -> None:
    assert (await post(live, body)).status_code == status
    assert await counts(db_pool) == NOTHING_STORED


async def test_unknown_endpoint_is_404(live: Live) -> None:
    body = encode([event(1)])
    assert (await post(live, body, path="/webhooks/unknown")).status_code == 404


async def test_declared_length_over_the_limit_is_413_before_reading(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    body = encode([event(i) for i in range(40)])
    assert len(body) > 4096
    assert (await post(live, body)).status_code == 413
    assert await counts(db_pool) == NOTHING_STORED


async def test_chunked_body_over_the_limit_is_413_never_truncated(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    body = encode([event(i) for i in range(40)])
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 512):
            sent.append(start)
            yield body[start : start + 512]

    headers = signed_headers(body, PATH)
    response = await live.client.post(PATH, content=chunks(), headers=headers)
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert await counts(db_pool) == NOTHING_STORED


async def test_chunked_body_within_the_limit_is_admitted(live: Live, db_pool: asyncpg.Pool) -> None:
    body = encode([event(1), event(2)])

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 64):
            yield body[start : start + 64]

    response = await live.client.post(PATH, content=chunks(), headers=signed_headers(body, PATH))
    assert response.status_code == 202
    assert (await counts(db_pool))["connector_event"] == 2


async def test_health_and_readiness(live: Live) -> None:
    assert (await live.client.get("/healthz")).status_code == 200
    assert (await live.client.get("/readyz")).json() == {"status": "ready"}
