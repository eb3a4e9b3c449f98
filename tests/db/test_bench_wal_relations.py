"""bench/wal_relations.py (P9's breakdown): a window of WAL, read back with pg_walinspect,
goes to the relations whose blocks its records name, and never adds up to more than the
window."""

from __future__ import annotations

import asyncpg

from bench.wal_relations import by_relation, by_table, report_lines
from tests.fixtures.postgres import PgServer


async def test_a_windows_wal_goes_to_the_table_and_index_written(
    pg_server: PgServer, db_dsn: str
) -> None:
    admin = await asyncpg.connect(pg_server.admin_dsn)
    bench = await asyncpg.connect(db_dsn)
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        await bench.execute("CREATE TABLE wal_probe (id integer PRIMARY KEY, body text)")
        # The test server commits asynchronously; the bench's is durable. A synchronous
        # commit puts the INSERT's records before the write position read after it.
        await bench.execute("SET synchronous_commit = on")
        start = await admin.fetchval("SELECT pg_current_wal_lsn()")
        await bench.execute(
            "INSERT INTO wal_probe SELECT g, repeat('x', 500) FROM generate_series(1, 200) g"
        )
        end = await admin.fetchval("SELECT pg_current_wal_lsn()")
        total = await admin.fetchval("SELECT $2::pg_lsn - $1::pg_lsn", start, end)
        shares = await by_relation(admin, bench, start, end)
    finally:
        await bench.close()
        await admin.close()
    named = {s.name: s for s in shares}
    heap, index = named["wal_probe"], named["wal_probe_pkey"]
    assert heap.records >= 200 and heap.bytes > 200 * 500
    assert index.records >= 200
    assert by_table(shares)["wal_probe"] >= heap.bytes + index.bytes
    # Other tests' writes in the window are counted too, under other names.
    assert sum(s.bytes for s in shares) <= total
    lines = list(report_lines(shares, int(total), 200, top=3))
    assert any(line.endswith("  wal_probe") for line in lines)
