"""Many rows into one table in one statement, each value sent once (NF-7's scale).

A page of adopted links or admitted attempts repeats most of its columns in every row:
the install's snapshots, the slot's names, the user's authority. Sent as one JSON array,
each row carried them again (a link row is ~1.8 kB, nearly all of it shared), and
encoding them in Python and parsing them in Postgres was most of a page's cost. Here the
columns whose value is the same in every row go once, as one JSON object, and only the
others once per row; Postgres joins the two back into whole rows. The rows written are
exactly those of the one-array form: a column absent from the rows takes its default.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from db.records import Conn

_INSERT: Final = """
INSERT INTO {table} ({columns})
SELECT {selected}
FROM jsonb_populate_record(NULL::{table}, $1::jsonb) AS s,
     jsonb_populate_recordset(NULL::{table}, $2::jsonb) AS r
"""


def split_shared(
    rows: Sequence[dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the columns equal in every row, each row's other columns); every row must name
    the same columns."""
    columns = list(rows[0])
    assert all(list(r) == columns for r in rows), "every row names the same columns"
    first = rows[0]
    shared = {c: first[c] for c in columns if all(_same(r[c], first[c]) for r in rows)}
    own = [c for c in columns if c not in shared]
    return shared, [{c: r[c] for c in own} for r in rows]


async def insert_rows(conn: Conn, table: str, rows: Sequence[dict[str, Any]]) -> None:
    """INSERT every row into `table` (a name from code), in one statement; a constraint
    or trigger that refuses one row refuses the statement."""
    if not rows:
        return
    shared, own = split_shared(rows)
    columns = [*shared, *own[0]]
    assert table.isidentifier() and all(c.isidentifier() for c in columns), "names from code"
    selected = [f"s.{c}" for c in shared] + [f"r.{c}" for c in own[0]]
    sql = _INSERT.format(table=table, columns=", ".join(columns), selected=", ".join(selected))
    await conn.execute(sql, to_json(shared), to_json(own))


def _same(a: object, b: object) -> bool:
    """Would `a` and `b` be stored as the same value? Python's `==` is not enough: it
    calls 1, 1.0 and True equal, and jsonb keeps them apart. (Key order is not compared:
    jsonb does not keep it, and every JSON column here is jsonb.)"""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def to_json(value: object) -> str:
    """Rows as the statements here take them: compact JSON, other values as text."""
    return json.dumps(value, separators=(",", ":"), default=str)
