"""Issue 32 item 5: one save's admission plans each statement once per connection, and the
plans it keeps are index probes at size.

Admission reads by key with the set-wise statements a batch uses, bound to one-element
arrays. Left to the default plan_cache_mode, Postgres found each generic plan dearer than
a custom plan for one element and planned five of them again on every save (0.7 ms of
its CPU per create, pg_stat_statements). `db.link_batches.keep_generic_plans` keeps the
generic plan; this shows no statement of a single-save admission is custom-planned, and
that every generic plan it runs reads no big table whole with 10,000 rows in each.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import asyncpg
import pytest

from db.link_batches import keep_generic_plans
from protocol.admission import CreateReserved
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from services.save_entry import admit_one
from tests.db.batch_admission_support import contact
from tests.db.scale_rows import BIG_TABLES, fill, plan_nodes
from tests.e2e.conftest import demo_manifest
from tests.fixtures.postgres import PgServer

N: Final = 10_000
PROBES: Final = ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")
SAVES: Final = 6  # more than the five custom plans Postgres tries before it compares


# Contacts the demo pack creates (each has the Email its mapping requires), readable by
# the saver.
RECORDS: Final = {
    "records": [
        {
            "object": "Contact",
            "id": f"p-{i}",
            "fields": {"LastName": f"P{i}", "Email": f"p{i}@x.example"},
        }
        for i in range(1, SAVES + 1)
    ],
    "grants": [
        {"user": "alice", "object": "Contact", "records": "*", "fields": ["LastName", "Email"]}
    ],
}


@dataclass(frozen=True)
class Admitted:
    statements: list[asyncpg.Record]  # the admitting connection's, with their plan counts
    dsn: str  # the database they ran on


@pytest.fixture(scope="module")
async def admitted(pg_server: PgServer, pg_template_db: str) -> AsyncIterator[Admitted]:
    """The prepared statements of the one connection that admitted SAVES saves, one by
    one, on a database with N rows in each big table (and the demo pack, and RECORDS)."""
    name = await pg_server.create_database("cp_admit_plans", template=pg_template_db)
    try:
        setup = await asyncpg.connect(pg_server.dsn(name))
        try:
            await fill(setup, N)
            await apply_pack(setup, demo_manifest("http://127.0.0.1:9"))
            await load_records(setup, parse_records_document(RECORDS))
        finally:
            await setup.close()
        pool = await asyncpg.create_pool(pg_server.dsn(name), min_size=1, max_size=1)
        try:
            for i in range(1, SAVES + 1):
                assert isinstance(await admit_one(pool, contact(f"p-{i}")), CreateReserved)
            async with pool.acquire() as conn:
                statements = await conn.fetch(
                    "SELECT statement, cardinality(parameter_types) AS params, generic_plans,"
                    " custom_plans FROM pg_prepared_statements"
                    " WHERE NOT from_sql ORDER BY statement"
                )
            yield Admitted(statements, pg_server.dsn(name))
        finally:
            await pool.close()
    finally:
        await pg_server.drop_database(name)


async def test_a_single_save_admission_is_never_custom_planned(admitted: Admitted) -> None:
    statements = admitted.statements
    assert len(statements) >= 8  # every statement of the admission, prepared on this connection
    custom = {" ".join(r["statement"].split())[:80]: r["custom_plans"] for r in statements}
    assert {s: n for s, n in custom.items() if n} == {}
    # The statements that read the save's own rows ran once per save, generic each time
    # (the pack's lineage is read once and cached).
    assert sum(r["generic_plans"] == SAVES for r in statements) >= 5


async def test_the_generic_plans_read_no_big_table_whole(admitted: Admitted) -> None:
    conn = await asyncpg.connect(admitted.dsn)
    try:
        full: dict[str, list[str]] = {}
        probed: set[str] = set()
        for row in admitted.statements:
            # The generic plan, as the admission's prepared statement keeps it.
            nulls = ", ".join(["NULL"] * row["params"])
            async with conn.transaction():
                await keep_generic_plans(conn)  # the plan the admission keeps
                await conn.execute(f"PREPARE admission AS {row['statement']}")
                explained = await conn.fetchval(
                    f"EXPLAIN (FORMAT JSON) EXECUTE admission{f'({nulls})' if nulls else ''}"
                )
                await conn.execute("DEALLOCATE admission")
            [plan] = json.loads(explained)
            nodes = list(plan_nodes(plan["Plan"]))
            probed |= {n["Relation Name"] for n in nodes if n["Node Type"] in PROBES}
            scans = [
                n["Relation Name"]
                for n in nodes
                if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG_TABLES
            ]
            if scans:
                full[" ".join(row["statement"].split())[:80]] = scans
    finally:
        await conn.close()
    assert full == {}
    # Not vacuous: the admission's reads of the link and attempt tables are among them.
    assert {"connector_remote_link", "connector_push_attempt"} <= probed
