"""Issue 34 item 4: `status` and every listing page read indexes, never a whole big table.

10,000 rows in each big table (set-wise, then VACUUM ANALYZE as autovacuum leaves a
settled table; `tests/db/scale_rows.py`), so the plans below are the planner's own
choice at a size where a full scan costs more than an index: no planner setting is
touched. Each statement is the one the command runs, with the parameters it binds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg
import pytest

from db import audit, link_search, pages
from db import status as status_q
from services.status import read_status
from tests.db.scale_rows import BIG_TABLES, fill, link_key_sql, plan_nodes
from tests.fixtures.postgres import PgServer

N: Final = 10_000


@pytest.fixture(scope="module")
async def big(pg_server: PgServer, pg_template_db: str) -> AsyncIterator[asyncpg.Connection]:
    async with pg_server.private_connection("cp_big", pg_template_db) as conn:
        await fill(conn, N)
        yield conn


async def _full_scans(conn: asyncpg.Connection, sql: str, *args: object) -> list[str]:
    """The big tables `sql` would read whole (a Seq Scan), as the planner chose."""
    [plan] = json.loads(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args))
    nodes = list(plan_nodes(plan["Plan"]))
    assert nodes and all("Node Type" in n for n in nodes)
    return [
        n["Relation Name"]
        for n in nodes
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG_TABLES
    ]


def _recently() -> datetime:
    return datetime.now(UTC) - timedelta(minutes=5)


# Every statement of `status` (services.status.read_status).
STATUS: Final = [
    pytest.param(status_q.LINKS_BY_STATE, (), id="links-by-state"),
    pytest.param(status_q.SUSPENDED_BY_SURFACE, (), id="suspended-by-surface"),
    pytest.param(status_q.PARKED_BY_REASON, (), id="parked-by-reason"),
    pytest.param(status_q.QUEUE_DEPTH, (), id="queue-depth"),
    pytest.param(status_q.RECENT, (_recently(),), id="recent"),
    pytest.param(status_q.OLDEST_PARKED, (), id="oldest-parked"),
]


@pytest.mark.parametrize(("sql", "args"), STATUS)
async def test_status_reads_no_big_table_whole(
    big: asyncpg.Connection, sql: str, args: tuple[object, ...]
) -> None:
    assert await _full_scans(big, sql, *args) == []


async def test_links_by_state_reads_the_counts_not_the_links(big: asyncpg.Connection) -> None:
    # Migration 0160: the per-state deltas, whatever the links' visibility map says.
    [plan] = json.loads(await big.fetchval(f"EXPLAIN (FORMAT JSON) {status_q.LINKS_BY_STATE}"))
    relations = {n.get("Relation Name") for n in plan_nodes(plan["Plan"])} - {None}
    assert relations == {"connector_link_state_count"}


async def test_the_fill_is_what_status_counts(big: asyncpg.Connection) -> None:
    # The rows are real: the counts the indexes give are the fill's distribution.
    s = await read_status(big, datetime.now(UTC))
    suspended, retired = N // 1000, N // 997 - N // (997 * 1000)
    assert s.links_by_state == {
        "finalized": N - suspended - retired,
        "suspended_drift": suspended,
        "retired": retired,
    }
    assert s.suspended_by_surface == {"drift:endpoint": suspended}
    assert s.pending_attempts == N // 300


async def _a_page_middle(conn: asyncpg.Connection, table: str, key: str) -> tuple[Any, Any]:
    """(created_at, key) of a row half way down, as a cursor names it."""
    row = await conn.fetchrow(
        f"SELECT created_at, {key} FROM {table} ORDER BY created_at DESC, {key} DESC"
        f" OFFSET {N // 2} LIMIT 1"
    )
    assert row is not None
    return row[0], row[1]


async def test_list_pages_read_no_big_table_whole(big: asyncpg.Connection) -> None:
    when, key = await _a_page_middle(big, "connector_remote_link", "link_key")
    at, attempt = await _a_page_middle(big, "connector_push_attempt", "attempt_id")
    cases: list[tuple[Any, ...]] = [
        (pages.LINKS_PAGE, None, "", 501),
        (pages.LINKS_PAGE, when, key, 501),
        (pages.LINKS_PAGE_BY_STATUS, None, "", 501, "finalized"),
        (pages.LINKS_PAGE_BY_STATUS, when, key, 501, "suspended_drift"),
        (pages.ATTEMPTS_PAGE, None, pages.NO_UUID, 501),
        (pages.ATTEMPTS_PAGE, at, attempt, 501),
        (pages.ATTEMPTS_PAGE_BY_STATUS, at, attempt, 501, "terminal_failed"),
        (pages.ATTEMPTS_PAGE_BY_STATUS, None, pages.NO_UUID, 501, "finalized"),
    ]
    for sql, *args in cases:
        assert await _full_scans(big, sql, *args) == [], args


async def test_find_and_audit_pages_read_no_big_table_whole(big: asyncpg.Connection) -> None:
    middle = await big.fetchval(f"SELECT {link_key_sql(N // 2)}")
    since = datetime.now(UTC) - timedelta(hours=1)
    cases: list[tuple[Any, ...]] = [
        (link_search.BY_RECORD_ID, 501, "", f"rec-{N // 2}"),
        (link_search.BY_REMOTE_ID, 501, middle, f"remote-{N // 2}"),
        (link_search.PARKED, 1_001, ""),
        (link_search.PARKED, 1_001, middle),
        (audit.SELECT_AUDIT, None, None, 101, audit.NO_AUDIT_ID),
        (audit.SELECT_AUDIT, None, None, 101, N // 2),
        (audit.SELECT_AUDIT, middle, None, 101, audit.NO_AUDIT_ID),
        (audit.SELECT_AUDIT, None, since, 101, N - 10),
    ]
    for sql, *args in cases:
        assert await _full_scans(big, sql, *args) == [], args


async def test_without_the_indexes_of_0120_status_and_pages_read_whole_tables(
    big: asyncpg.Connection,
) -> None:
    # The check above is not vacuous: the same statements, without the indexes migration
    # 0120 adds (dropped in a transaction that is rolled back), read whole tables.
    dropped = big.transaction()
    await dropped.start()
    try:
        for index in await big.fetch(
            "SELECT indexname FROM pg_indexes WHERE indexname LIKE ANY ($1)",
            ["%_created_ix", "%_status_ix", "connector_push_attempt_finalized_ix"],
        ):
            await big.execute(f"DROP INDEX {index['indexname']}")
        assert await _full_scans(big, status_q.RECENT, _recently()) == [
            "connector_push_attempt",
            "connector_patch_dispatch",
        ]
        links = await _full_scans(big, pages.LINKS_PAGE, None, "", 501)
        assert links == ["connector_remote_link"]
    finally:
        await dropped.rollback()
