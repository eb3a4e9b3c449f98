"""Issue 34 item 4: `status` counts links by state from the deltas the link triggers
append (migration 0160), never from the links, and the sums are the links' own counts
in every snapshot: whatever writes a link, set-wise or row by row, committed or rolled
back, while any number of folds run beside it."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta
from typing import Final

import asyncpg
import pytest

from db import status as status_q
from tests.db.rows import insert_link, insert_pack_install, set_status
from tests.e2e.support import eventually
from worker.link_counts import fold_counts

TRUTH: Final = "SELECT status, count(*) FROM connector_remote_link GROUP BY status"
DELTA_ROWS: Final = "SELECT count(*) FROM connector_link_state_count"


async def _truth(conn: asyncpg.Connection) -> dict[str, int]:
    return {row["status"]: row["count"] for row in await conn.fetch(TRUTH)}


async def _copies(conn: asyncpg.Connection, link_key: str, n: int) -> None:
    """`n` new links like `link_key`'s, in one INSERT ... SELECT (a set-wise write)."""
    columns = [
        row["column_name"]
        for row in await conn.fetch(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'connector_remote_link' AND is_generated = 'NEVER'"
            " ORDER BY ordinal_position"
        )
    ]
    changed = {
        "link_key": "'lk1_' || encode(sha256(convert_to(link_key || g, 'UTF8')), 'hex')",
        "source_record_id": "source_record_id || '-' || g",
        "remote_id": "remote_id || '-' || g",
    }
    await conn.execute(
        f"INSERT INTO connector_remote_link ({', '.join(columns)})"
        f" SELECT {', '.join(changed.get(c, c) for c in columns)}"
        " FROM connector_remote_link, generate_series(1, $2) g WHERE link_key = $1",
        link_key,
        n,
    )


async def test_every_change_of_state_is_counted_with_its_own_transaction(
    conn: asyncpg.Connection,
) -> None:
    pack = await insert_pack_install(conn)
    keys = [await insert_link(conn, pack) for _ in range(4)]
    await _copies(conn, keys[0], 3)
    await set_status(conn, "link", keys[0], "suspended_drift")
    await set_status(conn, "link", keys[1], "suspended_drift")
    await set_status(conn, "link", keys[1], "retired")
    await set_status(conn, "link", keys[2], "retired")
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await set_status(conn, "link", keys[3], "suspended_drift")
            await insert_link(conn, pack)
            raise RuntimeError("rolled back: neither change is counted")
    rows = await conn.fetchval(DELTA_ROWS)
    changed = await conn.execute("UPDATE connector_remote_link SET body_fingerprint = 'bf2'")
    assert changed == "UPDATE 7"
    assert await conn.fetchval(DELTA_ROWS) == rows  # the state unchanged: nothing appended

    expected = {"finalized": 4, "suspended_drift": 1, "retired": 2}
    assert await _truth(conn) == expected
    assert await status_q.links_by_state(conn) == expected
    await status_q.fold_link_state_counts(conn)
    assert await conn.fetchval(DELTA_ROWS) == 3  # one row per state
    assert await status_q.links_by_state(conn) == expected


async def _writer(dsn: str, pack: uuid.UUID, seed: int, links: int) -> None:
    """Links inserted one by one, each then maybe suspended, retired or rolled back."""
    rng = random.Random(seed)
    conn = await asyncpg.connect(dsn)
    try:
        for _ in range(links):
            key = await insert_link(conn, pack)
            move = rng.choice(["stay", "suspend", "retire", "roll back"])
            if move == "stay":
                continue
            try:
                async with conn.transaction():
                    await set_status(conn, "link", key, "suspended_drift")
                    if move == "retire":
                        await set_status(conn, "link", key, "retired")
                    if move == "roll back":
                        raise LookupError
            except LookupError:
                pass
    finally:
        await conn.close()


async def test_the_sums_equal_the_links_in_every_snapshot_while_writers_and_folds_race(
    db_dsn: str, conn: asyncpg.Connection
) -> None:
    pack = await insert_pack_install(conn)
    await insert_link(conn, pack)  # the first fold has rows to fold at once
    writers = [asyncio.create_task(_writer(db_dsn, pack, seed, 40)) for seed in range(4)]

    async def fold() -> None:
        folder = await asyncpg.connect(db_dsn)
        try:
            while not all(w.done() for w in writers):
                await status_q.fold_link_state_counts(folder)
        finally:
            await folder.close()

    folds = [asyncio.create_task(fold()) for _ in range(2)]
    snapshots = 0
    while not all(w.done() for w in writers) or snapshots == 0:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            assert await status_q.links_by_state(conn) == await _truth(conn)
        snapshots += 1
    await asyncio.gather(*writers, *folds)
    assert await status_q.links_by_state(conn) == await _truth(conn)
    assert sum((await _truth(conn)).values()) == 1 + 4 * 40


async def test_a_running_worker_folds_the_deltas_and_stops_with_it(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection
) -> None:
    pack = await insert_pack_install(conn)
    keys = [await insert_link(conn, pack) for _ in range(3)]
    await set_status(conn, "link", keys[0], "suspended_drift")
    assert await conn.fetchval(DELTA_ROWS) == 5  # three inserts, a move's two deltas
    stop = asyncio.Event()
    folding = asyncio.create_task(fold_counts(db_pool, stop, every=timedelta(milliseconds=50)))
    await eventually(lambda: conn.fetchval(DELTA_ROWS), lambda n: n == 2)
    assert await status_q.links_by_state(conn) == {"finalized": 2, "suspended_drift": 1}
    stop.set()
    await asyncio.wait_for(folding, timeout=10)
