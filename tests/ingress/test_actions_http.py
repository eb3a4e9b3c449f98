"""Workflow actions (ING-7): exact policies, FAIL_CONTINUE storing nothing, BLOCK only
after commit, idempotent callback ids, the disabled mode switch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from protocol.action_callback import CALLBACK_ID_MAX
from tests.ingress.support import (
    ACTION_SECRET,
    NOTHING_STORED,
    Live,
    counts,
    encode,
    execution,
    live_server,
    make_config,
    no_lock_waiters,
    signed_headers,
    wait_until,
)

PATH = "/actions/crm"


@pytest.fixture
async def live(db_dsn: str) -> AsyncIterator[Live]:
    async with live_server(make_config(), db_dsn) as server:
        yield server


async def call(live: Live, document: object, secret: str = ACTION_SECRET) -> object:
    body = encode(document)
    return await live.client.post(
        PATH, content=body, headers=signed_headers(body, PATH, secret=secret)
    )


async def test_best_effort_fails_continue_and_stores_nothing(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    response = await call(live, execution(action_id=11))
    assert response.status_code == 200
    assert response.json() == {"outputFields": {"hs_execution_state": "FAIL_CONTINUE"}}
    assert await counts(db_pool) == NOTHING_STORED


async def test_unknown_action_fails_closed_and_stores_nothing(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    response = await call(live, execution(action_id=33))
    assert response.status_code == 422
    assert await counts(db_pool) == NOTHING_STORED


async def test_bad_signature_stores_nothing(live: Live, db_pool: asyncpg.Pool) -> None:
    response = await call(live, execution(), secret="wrong")
    assert response.status_code == 401
    assert await counts(db_pool) == NOTHING_STORED


async def test_must_complete_blocks_after_commit(live: Live, db_pool: asyncpg.Pool) -> None:
    response = await call(live, execution("cb-7"))
    assert response.status_code == 200
    assert response.json() == {
        "outputFields": {"hs_execution_state": "BLOCK", "hs_expiration_duration": "PT2H"}
    }
    async with db_pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT callback_id, action_id, phase, expires_at - created_at AS ttl "
            "FROM workflow_action_execution"
        )
    assert (row["callback_id"], row["action_id"], row["phase"]) == ("cb-7", "22", "admitted")
    assert row["ttl"].total_seconds() == 7200


async def test_duplicate_callback_ids_are_one_execution(live: Live, db_pool: asyncpg.Pool) -> None:
    responses = await asyncio.gather(*(call(live, execution("cb-dup")) for _ in range(5)))
    assert {r.status_code for r in responses} == {200}
    assert {r.json()["outputFields"]["hs_execution_state"] for r in responses} == {"BLOCK"}
    assert await counts(db_pool) == {
        "ingress_receipt": 1,
        "connector_event": 0,
        "workflow_action_execution": 1,
    }


async def test_must_complete_answers_503_when_admission_fails(
    live: Live, db_pool: asyncpg.Pool
) -> None:
    async with db_pool.acquire() as locker, locker.transaction():
        await locker.execute("LOCK TABLE workflow_action_execution IN ACCESS EXCLUSIVE MODE")
        response = await call(live, execution("cb-late"))
        assert response.status_code == 503
        assert response.headers["retry-after"]
    await wait_until(lambda: no_lock_waiters(db_pool))
    assert await counts(db_pool) == NOTHING_STORED


async def test_disabled_mode_is_retryable_503_for_every_action(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    async with live_server(make_config(workflow_action_mode="disabled"), db_dsn) as live:
        for action_id in (11, 22, 33):
            response = await call(live, execution(action_id=action_id))
            assert response.status_code == 503
            assert response.headers["retry-after"]
    assert await counts(db_pool) == NOTHING_STORED


@pytest.mark.parametrize(
    "callback_id",
    [
        "L" * 256,  # past the bound; 1,000 and more also overflow Temporal's workflow id
        "L" * 100_000,
        "..",  # a dot segment: the completion would POST to another path
        "cb/../../crm/v3/objects/contacts",
        "cb 7",
        "cb-7?x=1",
        "-cb",
        "cb-ä",
    ],
)
async def test_a_callback_id_that_cannot_be_run_or_addressed_is_400_and_stores_nothing(
    live: Live, db_pool: asyncpg.Pool, callback_id: str
) -> None:
    """ING-3: a BLOCK for a callback whose workflow cannot start (Temporal's id limit) or
    whose completion URL it would reshape promises a completion that never comes."""
    response = await call(live, execution(callback_id))
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_callback_id"
    assert await counts(db_pool) == NOTHING_STORED


async def test_the_longest_admitted_callback_id_blocks(live: Live, db_pool: asyncpg.Pool) -> None:
    callback_id = "ap-" + "9" * (CALLBACK_ID_MAX - 5) + ":0"
    assert len(callback_id) == CALLBACK_ID_MAX
    response = await call(live, execution(callback_id))
    assert response.status_code == 200
    assert response.json()["outputFields"]["hs_execution_state"] == "BLOCK"
    async with db_pool.acquire() as conn:
        stored = await conn.fetchval("SELECT callback_id FROM workflow_action_execution")
    assert stored == callback_id
