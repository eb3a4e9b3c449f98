"""Bench P9 (migrations 0350, 0351): a create's claim and its answer are HOT updates of the
attempt's state row: no index names a column they change, so neither writes an index
entry. Admission and the finalize (the attempt settles) write them."""

from __future__ import annotations

import uuid

import asyncpg

from db import journal as jq
from db import links as q
from tests.db.rows import insert_attempt, insert_pack_install, new_link_key


async def _hot_updates(conn: asyncpg.Connection) -> int:
    """HOT updates of the attempt table in this transaction so far."""
    count: int = await conn.fetchval(
        "SELECT pg_stat_get_xact_tuples_hot_updated('connector_push_attempt'::regclass)"
    )
    return count


async def _claim_and_answer(conn: asyncpg.Connection, install: uuid.UUID) -> int:
    """Claim a new attempt with its checkpoint, then move it to writeback_pending with a
    remote id and the answer, in one transaction; how many of the two were HOT."""
    attempt_id = str(await insert_attempt(conn, install, link_key=new_link_key()))
    token = uuid.uuid4()
    async with conn.transaction():
        before = await _hot_updates(conn)
        assert await jq.claim_for_send(conn, attempt_id, token, checkpoint=True) is not None
        answer = {"status": 201, "remote_id": "r-1", "body_hash": "h", "etag": None}
        moved = await q.move_attempt(
            conn,
            attempt_id,
            ["processing"],
            "writeback_pending",
            token=token,
            response=answer,
            remote_id="r-1",
        )
        assert moved is not None and moved["request_snapshot"] is not None  # whole again
        return await _hot_updates(conn) - before


async def test_a_claim_and_its_answer_are_hot_updates(conn: asyncpg.Connection) -> None:
    install = await insert_pack_install(conn)
    assert await _claim_and_answer(conn, install) == 2


async def test_an_index_on_the_status_would_make_them_cold(conn: asyncpg.Connection) -> None:
    # The check above is not vacuous: with `status` indexed again (as before 0351, in a
    # transaction rolled back) neither update is HOT.
    install = await insert_pack_install(conn)
    rolled_back = conn.transaction()
    await rolled_back.start()
    try:
        await conn.execute("CREATE INDEX status_again ON connector_push_attempt (status)")
        assert await _claim_and_answer(conn, install) == 0
    finally:
        await rolled_back.rollback()
