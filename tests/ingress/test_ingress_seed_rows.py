"""Seed 004 ingress rows, each proven over HTTP against a real server and Postgres
(issue 30; SPEC §15 ING-2, ING-3, ING-7; SEED-ROWS-OPEN I-05, I-16, I-28): ack_drop
reasons and labels, best_effort still verifying, and the action switch. (The deadline
rows are in test_ingress_deadline_rows.py.)

`crm` is a retry webhook endpoint, `crm-drop` the same one opted into ack_drop and
`actions` the workflow-action endpoint (tests/ingress/support.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from cli.stack.postgres import EmbeddedPostgres
from db.migrate import apply_migrations
from ingress import app as ingress_app
from ingress.errors import DropReason
from ingress.metrics import DropCounter
from tests.ingress.pg_process import own_postgres
from tests.ingress.seed_rows_support import ACTIONS, DROP, RETRY, webhook
from tests.ingress.seed_rows_support import live as live  # the fixture
from tests.ingress.support import (
    ACTION_SECRET,
    NOTHING_STORED,
    Live,
    config_from,
    counts,
    encode,
    execution,
    live_server,
    make_config,
    no_lock_waiters,
    policy_document,
    signed_headers,
    wait_until,
)

ACK_DROP_LINE = re.compile(
    r'^connector_push_ingress_ack_drop_total\{endpoint="([^"]*)",reason="([^"]*)"\} (\d+)$'
)


@pytest.fixture
def postgres() -> Iterator[EmbeddedPostgres]:
    with own_postgres() as server:
        yield server


def _drop_series(metrics: str) -> dict[tuple[str, str], int]:
    series = {}
    for line in metrics.splitlines():
        if match := ACK_DROP_LINE.match(line):
            series[(match.group(1), match.group(2))] = int(match.group(3))
    return series


# -- I-05: ack_drop reasons under fixed, bounded labels ---------------------------------


async def test_i05_ack_drop_counts_each_failure_under_a_fixed_bounded_reason(
    postgres: EmbeddedPostgres,
) -> None:
    """I-05 / ING-2: on crm-drop an admission error (the server refuses the insert), a held
    commit (deadline) and the dependency down (Postgres stopped) each answer 204 and count
    under their own reason label. The labels are configured endpoint names x the closed
    `DropReason` set: request data (an unknown path, a retry endpoint's 503s) adds none."""
    dsn = postgres.dsn("postgres")
    await apply_migrations(dsn)
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(
            "CREATE FUNCTION refuse_event() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; "
            "CREATE TRIGGER refuse_event BEFORE INSERT ON connector_event "
            "FOR EACH ROW EXECUTE FUNCTION refuse_event()"
        )
        async with live_server(make_config(), dsn) as live:
            statuses = []
            body, headers = webhook(DROP, 1)
            statuses.append(await live.client.post(DROP, content=body, headers=headers))
            await admin.execute("DROP TRIGGER refuse_event ON connector_event")
            async with admin.transaction():
                await admin.execute("LOCK TABLE connector_event IN ACCESS EXCLUSIVE MODE")
                body, headers = webhook(DROP, 2)
                statuses.append(await live.client.post(DROP, content=body, headers=headers))
            # Neither the retry endpoint's 503 nor an unknown path adds an ack-drop label.
            async with admin.transaction():
                await admin.execute("LOCK TABLE connector_event IN ACCESS EXCLUSIVE MODE")
                body, headers = webhook(RETRY, 3)
                assert (
                    await live.client.post(RETRY, content=body, headers=headers)
                ).status_code == 503
            assert (await live.client.post("/webhooks/nope", content=b"[]")).status_code in (
                404,
                405,
            )
            await admin.close()
            await asyncio.to_thread(postgres.stop)
            body, headers = webhook(DROP, 4)
            statuses.append(await live.client.post(DROP, content=body, headers=headers))
            metrics = (await live.client.get("/metrics")).text
    finally:
        if not admin.is_closed():
            await admin.close()
    assert [(r.status_code, r.headers.get("retry-after")) for r in statuses] == [(204, None)] * 3
    assert _drop_series(metrics) == {
        ("crm-drop", DropReason.ADMISSION_FAILED.value): 1,
        ("crm-drop", DropReason.DEADLINE_EXCEEDED.value): 1,
        ("crm-drop", DropReason.DATABASE_UNAVAILABLE.value): 1,
    }, metrics


def test_i05_the_ack_drop_label_set_is_bounded() -> None:
    """I-05: the counter's series are at most (ack-drop capable endpoints) x DropReason;
    a name that is no configured endpoint is never a label."""
    counter = DropCounter(frozenset({"crm-drop"}), frozenset({"crm", "actions"}))
    for reason in DropReason:
        for name in ("crm-drop", "crm", "actions", 'x"} 1\nevil{a="', "/webhooks/crm-drop"):
            counter.increment(name, reason)
            counter.increment(name, reason)
    series = _drop_series(counter.render())
    assert set(series) == {("crm-drop", reason.value) for reason in DropReason}
    assert set(series.values()) == {2}
    assert {r.value for r in DropReason} == {
        "deadline_exceeded",
        "database_unavailable",
        "admission_failed",
        "over_capacity",
    }


# -- I-16: best_effort still verifies ----------------------------------------------------


@pytest.mark.parametrize("case", ["wrong_secret", "stale_timestamp", "unsigned"])
async def test_i16_best_effort_with_a_bad_signature_is_401_not_fail_continue(
    live: Live, db_pool: asyncpg.Pool, case: str
) -> None:
    """I-16 / ING-3 / ING-7: action 11 is best_effort; with a wrong secret (or a stale or
    missing signature) it is 401, never 200 FAIL_CONTINUE; nothing stored."""
    body = encode(execution(action_id=11))
    match case:
        case "wrong_secret":
            headers = signed_headers(body, ACTIONS, secret="not-the-action-secret")
        case "stale_timestamp":
            stale = ingress_app.wall_clock_ms() - 301_000
            headers = signed_headers(body, ACTIONS, secret=ACTION_SECRET, timestamp_ms=stale)
        case _:
            headers = {"content-type": "application/json"}
    response = await live.client.post(ACTIONS, content=body, headers=headers)
    assert response.status_code == 401
    assert "outputFields" not in response.json()
    # The same request correctly signed is the best-effort answer.
    good = await live.client.post(
        ACTIONS, content=body, headers=signed_headers(body, ACTIONS, secret=ACTION_SECRET)
    )
    assert (good.status_code, good.json()) == (
        200,
        {"outputFields": {"hs_execution_state": "FAIL_CONTINUE"}},
    )
    assert await counts(db_pool) == NOTHING_STORED


# -- I-28: the action switch and ack_drop touch only what they name -----------------------


async def test_i28_disabled_workflow_actions_leave_webhooks_admitting(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    """I-28 / ING-7: with workflow_action_mode=disabled a signed webhook is still 202 and
    stored, on the retry and the ack_drop endpoint; only the action endpoint is 503."""
    async with live_server(make_config(workflow_action_mode="disabled"), db_dsn) as live:
        statuses = {}
        for n, path in enumerate((RETRY, DROP), start=1):
            body, headers = webhook(path, n)
            response = await live.client.post(path, content=body, headers=headers)
            statuses[path] = response.status_code
        body = encode(execution())
        action = await live.client.post(
            ACTIONS, content=body, headers=signed_headers(body, ACTIONS, secret=ACTION_SECRET)
        )
    assert statuses == {RETRY: 202, DROP: 202}
    assert action.status_code == 503
    assert await counts(db_pool) == {
        "ingress_receipt": 2,
        "connector_event": 2,
        "workflow_action_execution": 0,
    }


async def _action_answers(live: Live, db_pool: asyncpg.Pool, run: str) -> list[tuple[Any, ...]]:
    """Every kind of action answer: best-effort, BLOCK, unknown action, bad signature, and a
    must-complete whose admission cannot commit in time."""

    async def post(document: dict[str, Any], secret: str = ACTION_SECRET) -> tuple[Any, ...]:
        body = encode(document)
        response = await live.client.post(
            ACTIONS, content=body, headers=signed_headers(body, ACTIONS, secret=secret)
        )
        return response.status_code, response.json(), "retry-after" in response.headers

    answers = [
        await post(execution(f"{run}-11", action_id=11)),
        await post(execution(f"{run}-22", action_id=22)),
        await post(execution(f"{run}-33", action_id=33)),
        await post(execution(f"{run}-bad", action_id=22), secret="wrong"),
    ]
    async with db_pool.acquire() as locker, locker.transaction():
        await locker.execute("LOCK TABLE workflow_action_execution IN ACCESS EXCLUSIVE MODE")
        answers.append(await post(execution(f"{run}-late", action_id=22)))
    await wait_until(lambda: no_lock_waiters(db_pool))
    return answers


async def test_i28_ack_drop_on_crm_drop_leaves_the_action_answers_unchanged(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    """I-28 / ING-2 / ING-7: the same action requests answered with crm-drop in ack_drop
    and with no ack_drop endpoint at all: identical answers, the internal failure a 503
    with Retry-After (never a 204), and identical rows stored."""
    results = []
    for run, ack_drop in (("a", ["crm-drop"]), ("b", [])):
        config = make_config(ack_drop_endpoints=ack_drop)
        async with live_server(config, db_dsn) as live:
            results.append(await _action_answers(live, db_pool, run))
    with_drop, without = results
    assert with_drop == without
    assert [(status, retry) for status, _, retry in with_drop] == [
        (200, False),
        (200, False),
        (422, False),
        (401, False),
        (503, True),
    ]
    rows = await db_pool.fetch("SELECT callback_id FROM workflow_action_execution")
    assert sorted(r["callback_id"] for r in rows) == ["a-22", "b-22"]


async def test_i05_postgres_shutting_down_mid_admission_counts_as_dependency_down(
    postgres: EmbeddedPostgres,
) -> None:
    """I-05 / ING-2: Postgres shuts down while a crm-drop admission waits inside it (the
    server ends the session with `admin_shutdown`): the answer is 204, counted under
    `database_unavailable`, the dependency being down, not as an admission error."""
    dsn = postgres.dsn("postgres")
    await apply_migrations(dsn)
    document = policy_document()
    document["endpoints"][1]["deadline_ms"] = 20_000  # crm-drop: the shutdown comes first
    admin = await asyncpg.connect(dsn)
    try:
        async with live_server(config_from(document), dsn) as live:
            transaction = admin.transaction()
            await transaction.start()
            await admin.execute("LOCK TABLE connector_event IN ACCESS EXCLUSIVE MODE")
            body, headers = webhook(DROP, 1)
            request = asyncio.create_task(live.client.post(DROP, content=body, headers=headers))

            async def admission_waits() -> bool:
                # Not on `admin`: a transaction sees one snapshot of pg_stat_activity.
                probe = await asyncpg.connect(dsn)
                try:
                    waiting: int = await probe.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                finally:
                    await probe.close()
                return waiting == 1

            await wait_until(admission_waits, what="the admission waits on the lock")
            await asyncio.to_thread(postgres.stop)
            response = await request
            metrics = (await live.client.get("/metrics")).text
    finally:
        admin.terminate()
    assert (response.status_code, response.headers.get("retry-after")) == (204, None)
    assert _drop_series(metrics) == {("crm-drop", DropReason.DATABASE_UNAVAILABLE.value): 1}, (
        metrics
    )
