"""bench/floor_io.py (issue 32, SPEC §16 P1_io): the floor_io activity writes one row as
wide as the finalized attempt it copies, walks it pending → processing → finalized, and
POSTs once to the sandbox, whose id it records."""

from __future__ import annotations

import json

import asyncpg

from bench.floor import FloorInput
from bench.floor_io import TABLE, FloorIO, prepare
from protocol.states import ATTEMPT_INITIAL, ATTEMPT_TRANSITIONS, AttemptStatus
from sandbox.server import BackgroundSandbox
from tests.db.rows import insert_attempt, insert_pack_install, new_link_key, path_to, set_status
from tests.sandbox.support import CONTACTS, contact, make_config
from worker.runtime import remote_http_client

REQUEST = {
    "method": "POST",
    "relative_path": CONTACTS,
    "headers": {"Idempotency-Key": "k"},
    "body": contact("real@example.com", firstname="Real", lastname="Person"),
    "profile": {"name": "sandbox-idempotent", "base_url": "http://127.0.0.1:1"},
}


async def test_floor_io_copies_an_attempts_width_and_posts_once(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    async with db_pool.acquire() as conn:
        install = await insert_pack_install(conn)
        attempt = await insert_attempt(conn, install, link_key=new_link_key())
        await conn.execute(
            "UPDATE connector_push_attempt_request SET request_snapshot = $2 WHERE attempt_id = $1",
            attempt,
            json.dumps(REQUEST),
        )
        for step in path_to(ATTEMPT_TRANSITIONS, ATTEMPT_INITIAL, AttemptStatus.FINALIZED):
            await set_status(conn, "attempt", attempt, step.value)
        await conn.execute(
            "UPDATE connector_push_attempt SET response_snapshot = $2, mirror_status = 'written' "
            "WHERE attempt_id = $1",
            attempt,
            json.dumps({"status": 201, "remote_id": "r-1", "recovery_headers": {}}),
        )
    template = await prepare(db_dsn)

    with BackgroundSandbox(make_config()) as sandbox:
        async with remote_http_client() as http:
            remote_id = await FloorIO(db_pool, http, sandbox.url, template).floor_io(
                FloorInput(key="floor/t/0", activity="floor_io")
            )
            listed = (await http.get(f"{sandbox.url}{CONTACTS}/{remote_id}")).json()

    assert listed["id"] == remote_id  # the POST landed, once: its id is the row's
    async with db_pool.acquire() as conn:
        rows = await conn.fetch(f"SELECT * FROM {TABLE}")
        widths = await conn.fetchval(
            f"SELECT (SELECT pg_column_size(f.request_snapshot) FROM {TABLE} f) "
            "= pg_column_size(a.request_snapshot) FROM connector_push_attempt_frozen a "
            "WHERE attempt_id = $1",
            attempt,
        )
    assert len(rows) == 1
    row = rows[0]
    assert (row["status"], row["remote_id"], row["mirror_status"]) == (
        "finalized",
        remote_id,
        "written",
    )
    assert row["claim_token"] is not None and row["remote_io_started_at"] is not None
    assert widths is True
