"""`db.row_sets.insert_rows` (issue 34: a page's shared columns sent once) writes exactly
the rows the one-JSON-array form writes, against a real database: shared and own columns,
values Python calls equal but jsonb keeps apart, omitted columns' defaults, a refused row."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from db.row_sets import insert_rows, split_shared

TABLE = """
CREATE TEMP TABLE {name} (
    id integer PRIMARY KEY,
    kind text NOT NULL,
    at timestamptz,
    doc jsonb,
    n numeric,
    note text NOT NULL DEFAULT 'default note' CHECK (note <> 'refused')
)
"""
ONE_ARRAY = """
INSERT INTO {name} (id, kind, at, doc, n)
SELECT id, kind, at, doc, n FROM jsonb_populate_recordset(NULL::{name}, $1::jsonb)
"""
READ = "SELECT id, kind, at, doc::text AS doc, n::text AS n, note FROM {name} ORDER BY id"


def _rows() -> list[dict[str, Any]]:
    shared_doc = {"snapshot": {"a": [1, 2, {"b": None}]}, "flag": True}
    return [
        # `doc` differs only where Python's == would not see it: 1, 1.0 and True.
        {"id": 1, "kind": "k", "at": "2026-12-05T00:00:00+00:00", "doc": {"v": 1}, "n": 1},
        {"id": 2, "kind": "k", "at": "2026-12-05T00:00:00+00:00", "doc": {"v": 1.0}, "n": 1},
        {"id": 3, "kind": "k", "at": "2026-12-05T00:00:00+00:00", "doc": {"v": True}, "n": 1},
        {"id": 4, "kind": "k", "at": "2026-12-05T00:00:00+00:00", "doc": shared_doc, "n": 1},
    ]


def test_values_python_calls_equal_but_json_keeps_apart_are_not_shared() -> None:
    rows = _rows()
    shared, own = split_shared(rows)
    assert shared == {"kind": "k", "at": "2026-12-05T00:00:00+00:00", "n": 1}
    assert [list(r) for r in own] == [["id", "doc"]] * 4
    assert split_shared([{"x": 1}, {"x": 1.0}]) == ({}, [{"x": 1}, {"x": 1.0}])
    assert split_shared([{"x": [1]}, {"x": (1,)}])[0] == {}  # a list and a tuple: not shared
    # One row: every column is shared, and there is still one (empty) row of its own.
    assert split_shared([{"x": 1}]) == ({"x": 1}, [{}])


@pytest.mark.parametrize("count", [1, 3, 4])
async def test_insert_rows_writes_what_the_one_array_form_writes(
    db_pool: asyncpg.Pool, count: int
) -> None:
    rows = _rows()[:count]
    async with db_pool.acquire() as conn:
        for name in ("by_row_sets", "by_one_array"):
            await conn.execute(TABLE.format(name=name))
        await insert_rows(conn, "by_row_sets", rows)
        await conn.execute(ONE_ARRAY.format(name="by_one_array"), json.dumps(rows))
        written = [dict(r) for r in await conn.fetch(READ.format(name="by_row_sets"))]
        expected = [dict(r) for r in await conn.fetch(READ.format(name="by_one_array"))]
    assert written == expected
    assert len(written) == count
    assert {r["note"] for r in written} == {"default note"}  # omitted: its default
    if count >= 3:  # at 3 every `doc` is == to the others; each must still be its own
        assert [r["doc"] for r in written[:3]] == ['{"v": 1}', '{"v": 1.0}', '{"v": true}']


async def test_a_refused_row_refuses_the_statement(db_pool: asyncpg.Pool) -> None:
    rows = [{"id": i, "kind": "k", "note": "fine" if i else "refused"} for i in range(3)]
    async with db_pool.acquire() as conn:
        await conn.execute(TABLE.format(name="refusing"))
        with pytest.raises(asyncpg.CheckViolationError):
            await insert_rows(conn, "refusing", rows)
        assert await conn.fetchval("SELECT count(*) FROM refusing") == 0
