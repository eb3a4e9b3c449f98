"""ING-4 / ING-2: a commit held past the deadline answers 503 + Retry-After (retry) or
204 without it (ack_drop), and stores nothing either way."""

from __future__ import annotations

import asyncpg
import pytest

from tests.ingress.support import (
    NOTHING_STORED,
    config_from,
    counts,
    encode,
    event,
    live_server,
    make_config,
    no_lock_waiters,
    policy_document,
    signed_headers,
    wait_until,
)


@pytest.mark.parametrize(
    ("path", "status", "retry_after"),
    [("/webhooks/crm", 503, "5"), ("/webhooks/crm-drop", 204, None)],
)
async def test_commit_held_past_the_deadline(
    db_dsn: str, db_pool: asyncpg.Pool, path: str, status: int, retry_after: str | None
) -> None:
    body = encode([event(1), event(2)])
    async with live_server(make_config(), db_dsn) as live, db_pool.acquire() as locker:
        async with locker.transaction():
            await locker.execute("LOCK TABLE connector_event IN ACCESS EXCLUSIVE MODE")
            response = await live.client.post(
                path, content=body, headers=signed_headers(body, path)
            )
            assert response.status_code == status
            assert response.headers.get("retry-after") == retry_after
            assert response.elapsed.total_seconds() < 5
        # Lock released: the cancelled admission must not commit afterwards.
        await wait_until(lambda: no_lock_waiters(db_pool))
        assert await counts(db_pool) == NOTHING_STORED
        metrics = (await live.client.get("/metrics")).text
    dropped = 'endpoint="crm-drop",reason="deadline_exceeded"} 1'
    assert (dropped in metrics) is (status == 204)
    # The status view's 503s (issue 14 item 4): counted per endpoint, drops are not 503s.
    unavailable = 'connector_push_ingress_unavailable_total{endpoint="crm"} 1'
    assert (unavailable in metrics) is (status == 503)


async def test_sender_timeout_header_shortens_the_deadline(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    document = policy_document()
    document["endpoints"][0].update(
        deadline_ms=8000, timeout_header="X-Sender-Timeout-Millis", timeout_margin_ms=250
    )
    body = encode([event(1)])
    headers = {**signed_headers(body, "/webhooks/crm"), "x-sender-timeout-millis": "600"}
    async with live_server(config_from(document), db_dsn) as live, db_pool.acquire() as locker:
        async with locker.transaction():
            await locker.execute("LOCK TABLE connector_event IN ACCESS EXCLUSIVE MODE")
            response = await live.client.post("/webhooks/crm", content=body, headers=headers)
        assert response.status_code == 503
        # min(8000, 600 - 250) = 350 ms, far below the configured 8 s.
        assert response.elapsed.total_seconds() < 4
        await wait_until(lambda: no_lock_waiters(db_pool))
        assert await counts(db_pool) == NOTHING_STORED
