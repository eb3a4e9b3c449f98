"""NF-5: one request's failure never fails another's. A request the database cannot
store is refused before it joins a group commit; a shared transaction the server still
refuses is retried member by member, so only the culprit gets the error."""

from __future__ import annotations

import asyncio
import json

import asyncpg

from ingress.config import IngressConfig
from tests.ingress.support import (
    Live,
    config_from,
    encode,
    event,
    live_server,
    policy_document,
    signed_headers,
)

PATH = "/webhooks/crm"
SENDERS = 6
PER_SENDER = 40


async def _post(live: Live, body: bytes) -> int:
    response = await live.client.post(PATH, content=body, headers=signed_headers(body, PATH))
    return response.status_code


async def _valid_sender(live: Live, sender: int) -> list[int]:
    return [
        await _post(live, encode([event(sender * 1000 + n, object_id=sender)]))
        for n in range(PER_SENDER)
    ]


async def _bad_sender(live: Live, body: bytes, stop: asyncio.Event) -> list[int]:
    statuses = []
    while not stop.is_set():
        statuses.append(await _post(live, body))
    return statuses


async def _run(live: Live, bad_body: bytes) -> tuple[list[int], list[int]]:
    stop = asyncio.Event()
    bad = asyncio.create_task(_bad_sender(live, bad_body, stop))
    try:
        valid = await asyncio.gather(*(_valid_sender(live, s) for s in range(SENDERS)))
    finally:
        stop.set()
    return [s for statuses in valid for s in statuses], await bad


def _patient_config() -> IngressConfig:
    """The isolation rule is under test, not ING-4: a deadline generous enough that a
    loaded machine's slow commit is not mistaken for one request failing another."""
    document = policy_document()
    for endpoint in document["endpoints"]:
        endpoint["deadline_ms"] = 10_000
    return config_from(document)


async def _events(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM connector_event"))


async def test_six_valid_senders_beside_an_unstorable_one_are_all_admitted(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    poisoned = json.dumps([event(99, changeSource="\ud800")]).encode("ascii")
    async with live_server(_patient_config(), db_dsn) as live:
        valid, bad = await _run(live, poisoned)
    assert valid == [202] * (SENDERS * PER_SENDER)
    assert bad and set(bad) == {400}
    assert await _events(db_pool) == SENDERS * PER_SENDER


async def test_a_batch_the_server_refuses_is_retried_one_by_one(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    # Something only the server knows: a constraint the request passes parse-time checks for.
    await db_pool.execute(
        "ALTER TABLE connector_event ADD CONSTRAINT no_poison "
        "CHECK (event_type <> 'contact.poison')"
    )
    poisoned = encode([event(99, subscriptionType="contact.poison")])
    document = policy_document()
    document["endpoints"][0]["routes"]["contact.poison"] = "remote_property_change"
    async with live_server(config_from(document), db_dsn) as live:
        valid, bad = await _run(live, poisoned)
        isolations = live.ingress.admitter.group_isolations
    assert valid == [202] * (SENDERS * PER_SENDER)
    assert bad and set(bad) == {503}  # a server-side refusal stays a retryable 503 (ING-2)
    assert await _events(db_pool) == SENDERS * PER_SENDER
    assert isolations is not None and isolations >= 1
