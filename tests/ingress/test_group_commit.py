"""Group commit (ING-1 at throughput): concurrent deliveries share transactions, and every
202 still follows the commit holding its rows. (The deadline tests prove a withdrawn
request leaves nothing behind with group commit on, which is the default.)"""

from __future__ import annotations

import asyncio
import secrets

import asyncpg

from tests.ingress.support import encode, event, live_server, make_config, signed_headers

PATH = "/webhooks/crm"


async def test_concurrent_deliveries_share_commits_and_are_all_stored(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    deliveries = [encode([event(secrets.randbelow(10**12))]) for _ in range(48)]
    async with live_server(make_config(), db_dsn) as live:
        responses = await asyncio.gather(
            *(
                live.client.post(PATH, content=body, headers=signed_headers(body, PATH))
                for body in deliveries
            )
        )
        commits = live.ingress.admitter.group_commits
    assert [r.status_code for r in responses] == [202] * len(deliveries)
    acknowledged = {r.json()["receipts"][0]["eventId"] for r in responses}
    stored = {r["event_id"] for r in await db_pool.fetch("SELECT event_id FROM connector_event")}
    assert stored == acknowledged and len(stored) == len(deliveries)
    assert commits is not None and 1 <= commits < len(deliveries)
