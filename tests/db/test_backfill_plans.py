"""Issue 34 item 3: a backfill page's locator lookup reads one link per locator at any size,
whatever the statistics say.

A backfill into an empty table is the common case (the initial adoption of a legacy
system), and the table grows a page at a time while the run's connection keeps its
cached plan. Planned from statistics taken when the table was small, the join form read
every link of the owner on every page (a hash join), ~10^9 rows over a million-record
run; measured at 100,000 records it took Postgres from 9 to 31 s. The lookup is one
probe of the locator index per locator, and this shows it on a table analyzed empty
that then grew to 20,000 links, in the generic plan a prepared statement caches and in
a custom plan.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

import asyncpg
import pytest

from db.backfill import SELECT_LOCATOR_OWNERS
from tests.db.scale_rows import INSTALL, LINKS, plan_nodes
from tests.fixtures.postgres import PgServer

ROWS: Final = 20_000  # the table when the page runs; it was empty when last analyzed
PAGE: Final = 500


@pytest.fixture(scope="module")
async def grown(pg_server: PgServer, pg_template_db: str) -> AsyncIterator[asyncpg.Connection]:
    async with pg_server.private_connection("cp_grown", pg_template_db) as conn:
        # Analyzed empty, as a fresh install leaves it, and not again while it grows.
        await conn.execute("ALTER TABLE connector_remote_link SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE connector_remote_link")
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            install = uuid.uuid4()
            await conn.execute(INSTALL, install)
            await conn.execute(LINKS, ROWS, install)
        yield conn


def _link_rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of the link table returned, over all their loops."""
    return sum(
        int(n["Actual Rows"]) * int(n["Actual Loops"])
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "connector_remote_link"
    )


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
async def test_a_page_reads_one_link_per_locator_after_the_table_grew(
    grown: asyncpg.Connection, mode: str
) -> None:
    # A page of locators, half of them held by a link, half by none.
    held = await grown.fetch(
        "SELECT remote_id FROM connector_remote_link WHERE status <> 'retired'"
        " ORDER BY source_record_id DESC LIMIT $1",
        PAGE // 2,
    )
    ids = [r["remote_id"] for r in held] + [f"absent-{i}" for i in range(PAGE // 2)]
    # EXECUTE takes no bound parameters: the page's arrays as literals (test values only).
    arrays = ", ".join(
        f"'{{{','.join(values)}}}'" for values in (["dest-1"] * PAGE, ["scope-1"] * PAGE, ids)
    )
    execute = f"EXECUTE locators('owner-1', {arrays})"
    async with grown.transaction():
        await grown.execute(f"SET LOCAL plan_cache_mode = {mode}")
        await grown.execute(f"PREPARE locators AS {SELECT_LOCATOR_OWNERS}")
        try:
            explained = await grown.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {execute}")
            found = await grown.fetch(execute)
        finally:
            await grown.execute("DEALLOCATE locators")
    [plan] = json.loads(explained)
    assert len(found) == PAGE // 2
    assert _link_rows_read(plan["Plan"]) <= PAGE, json.dumps(plan["Plan"], indent=1)
