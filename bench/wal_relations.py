"""P9's breakdown: a window of WAL shared out by relation, read with pg_walinspect.

Each record's length goes to the relations of its blocks: a block's own data and
full-page image to its relation, the rest of the record (its header and main data)
in equal parts to each block it names. Records without a block (commits, running
transactions) are counted by resource manager; what is left of the window beyond the
records' lengths is page headers and alignment. The names are read in the bench
database (relation file numbers are per database).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import asyncpg

# One row per block reference in the window, with the record's share besides its own.
_BLOCKS: Final = """
WITH b AS (
    SELECT start_lsn, reldatabase, relfilenode, relforknumber, record_length,
           block_data_length + coalesce(block_fpi_length, 0) AS own,
           coalesce(block_fpi_length, 0) AS fpi
    FROM pg_get_wal_block_info($1::pg_lsn, $2::pg_lsn, false)
), r AS (
    SELECT start_lsn, max(record_length) - sum(own) AS rest, count(*) AS refs
    FROM b GROUP BY start_lsn
)
SELECT b.reldatabase, b.relfilenode, b.relforknumber,
       sum(b.own + r.rest::float8 / r.refs) AS bytes,
       sum(b.fpi) AS fpi,
       count(DISTINCT b.start_lsn) AS records
FROM b JOIN r USING (start_lsn)
GROUP BY 1, 2, 3
"""

# Records that name no block, by resource manager.
_BLOCKLESS: Final = """
SELECT resource_manager, sum(record_length) AS bytes, count(*) AS records
FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
WHERE block_ref IS NULL
GROUP BY 1
"""

# The bench database's relations by file number, each with the table it belongs to (an
# index's, a TOAST table's and a TOAST index's); a TOAST table and its index are named
# after the table they serve.
_NAMES: Final = """
SELECT pg_relation_filenode(c.oid) AS filenode,
       coalesce(owner.relname, heap.relname, c.relname) AS table_name,
       CASE WHEN owner.relname IS NULL THEN c.relname
            WHEN c.relkind = 'i' THEN owner.relname || ' (TOAST index)'
            ELSE owner.relname || ' (TOAST)' END AS name
FROM pg_class c
LEFT JOIN pg_index i ON i.indexrelid = c.oid
LEFT JOIN pg_class heap ON heap.oid = i.indrelid
LEFT JOIN pg_class owner
    ON owner.reltoastrelid = CASE WHEN c.relkind = 'i' THEN heap.oid ELSE c.oid END
WHERE pg_relation_filenode(c.oid) IS NOT NULL
"""

FORKS: Final = {0: "", 1: " (free space map)", 2: " (visibility map)", 3: " (init)"}


@dataclass(frozen=True)
class Share:
    name: str  # the relation (or, for records without a block, their resource manager)
    table: str  # the table it belongs to (its own name for a table)
    bytes: float
    fpi: int  # of which full-page images
    records: int


async def by_relation(
    admin: asyncpg.Connection, bench: asyncpg.Connection, start: object, end: object
) -> list[Share]:
    """The WAL between `start` and `end` by relation, largest first; `admin` has
    pg_walinspect, `bench` is a connection to the bench database (for the names)."""
    database = await bench.fetchval(
        "SELECT oid FROM pg_database WHERE datname = current_database()"
    )
    names = {row["filenode"]: (row["name"], row["table_name"]) for row in await bench.fetch(_NAMES)}
    shares: list[Share] = []
    for row in await admin.fetch(_BLOCKS, start, end):
        if row["reldatabase"] == database and row["relfilenode"] in names:
            name, table = names[row["relfilenode"]]
        else:
            name = table = "(another database or a shared catalog)"
        fork = FORKS.get(row["relforknumber"], "")
        shares.append(Share(name + fork, table, row["bytes"], int(row["fpi"]), row["records"]))
    for row in await admin.fetch(_BLOCKLESS, start, end):
        label = f"({row['resource_manager']} records without a block)"
        shares.append(Share(label, label, float(row["bytes"]), 0, row["records"]))
    return _merged(shares)


def _merged(shares: list[Share]) -> list[Share]:
    """One share per name (several file numbers can carry one name), largest first."""
    merged: dict[str, Share] = {}
    for s in shares:
        if (m := merged.get(s.name)) is not None:
            s = Share(s.name, s.table, m.bytes + s.bytes, m.fpi + s.fpi, m.records + s.records)
        merged[s.name] = s
    return sorted(merged.values(), key=lambda s: -s.bytes)


def by_table(shares: list[Share]) -> dict[str, float]:
    """Bytes by table: its heap, TOAST and indexes together, largest first."""
    tables: dict[str, float] = defaultdict(float)
    for s in shares:
        tables[s.table] += s.bytes
    return dict(sorted(tables.items(), key=lambda kv: -kv[1]))


def report_lines(shares: list[Share], total: int, n: int, top: int) -> Iterator[str]:
    """The printed breakdown: per create, by table, then the `top` relations."""
    counted = sum(s.bytes for s in shares)
    yield f"P9 WAL by table, bytes per create (of {total / n:,.0f}):"
    for table, value in by_table(shares).items():
        yield f"  {value / n:9,.0f}  {table}"
    yield f"  {(total - counted) / n:9,.0f}  (page headers and alignment)"
    yield f"P9 WAL by relation, the {top} largest: bytes per create (of which images), records"
    for s in shares[:top]:
        yield f"  {s.bytes / n:9,.0f} ({s.fpi / n:7,.0f})  {s.records / n:6.2f}  {s.name}"
