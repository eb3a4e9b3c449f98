"""An initial sync over `POST /v1/saves/batch` with the Python client (issue 34 item 2):
`SaveApiClient.save_all` reads the CRM's records as an iterator, a batch at a time, and
a run cut short resumes under the same idempotency prefix, admitting nothing twice."""

from __future__ import annotations

from collections.abc import Iterator

import asyncpg

from connector_push_client import SaveApiClient, SaveIn
from tests.db.push_support import load_bulk_contacts
from tests.e2e.save_api_support import CRM_KEY, save_body, save_server

N = 23  # the test server's max_batch is 5: four full batches and one of three
BATCH = 5


class Source:
    """The CRM's records as a generator that counts how many were read so far."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.read = 0

    def __iter__(self) -> Iterator[SaveIn]:
        for record_id in self.ids:
            self.read += 1
            yield SaveIn.model_validate(save_body(record_id))


async def _attempts(pool: asyncpg.Pool) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT count(*) AS n, count(DISTINCT link_key) AS keys FROM connector_push_attempt"
    )
    assert row is not None
    return row["n"], row["keys"]


async def test_save_all_streams_batches_and_resumes_under_its_prefix(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    async with demo_db.acquire() as conn:
        ids = await load_bulk_contacts(conn, N)
    async with save_server(db_dsn) as live, SaveApiClient(live.base_url, CRM_KEY) as api:
        source, sent = Source(ids), 0
        async for answer in api.save_all(source, batch_size=BATCH, idempotency_prefix="sync-1"):
            sent += len(answer.results)
            assert source.read == sent  # read no further ahead than the batch it sent
            assert not answer.replayed
            if sent == 3 * BATCH:
                break  # the sync is cut short after three batches
        assert await _attempts(demo_db) == (3 * BATCH, 3 * BATCH)

        source, replayed, admitted = Source(ids), 0, 0
        async for answer in api.save_all(source, batch_size=BATCH, idempotency_prefix="sync-1"):
            decisions = {r.decision for r in answer.results}
            if answer.replayed:
                replayed += len(answer.results)
            else:
                assert decisions == {"create_reserved"}, answer
                admitted += len(answer.results)
        assert (replayed, admitted, source.read) == (3 * BATCH, N - 3 * BATCH, N)
    assert await _attempts(demo_db) == (N, N)  # each record admitted exactly once
