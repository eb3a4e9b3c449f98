"""Issue 34 item 4: `links list`, `attempts list`, `links find` and `audit` page by cursor
to the end, every row once, in order; `--json` is JSON Lines on stdout and the next page
is named on stderr (a JSON object with `--json`, a line under a table)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner, Result

from cli import link_views
from cli.main import app
from db import audit as audit_q
from protocol.audit import AuditCommand, AuditEntry
from protocol.park import ParkReason
from tests.db.rows import (
    insert_attempt,
    insert_link,
    insert_pack_install,
    new_link_key,
    set_status,
)


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(app, args)


async def _pages(db_dsn: str, *args: str) -> list[list[dict[str, Any]]]:
    """Every page of `args --json`, following the cursor each page prints on stderr."""
    pages: list[list[dict[str, Any]]] = []
    after: list[str] = []
    while len(pages) < 20:
        result = await asyncio.to_thread(
            _invoke, [*args, "--json", *after, "--database-url", db_dsn]
        )
        assert result.exit_code == 0, result.output
        pages.append([json.loads(line) for line in result.stdout.splitlines()])
        if not result.stderr:
            return pages
        more = json.loads(result.stderr)
        # The exact next command, less --database-url (which may hold a password).
        expected = ["connector-push", *args, "--after", more["next_cursor"]]
        assert more["next_command"] == shlex.join(expected)
        assert db_dsn not in result.stderr
        after = ["--after", more["next_cursor"]]
    raise AssertionError("the pages never ended")


async def _links(conn: asyncpg.Connection) -> list[str]:
    install = await insert_pack_install(conn)
    async with conn.transaction():  # one created_at for these five: the key breaks the tie
        for _ in range(5):
            await insert_link(conn, install)
    for _ in range(2):
        await insert_link(conn, install)
    rows = await conn.fetch(
        "SELECT link_key FROM connector_remote_link ORDER BY created_at DESC, link_key DESC"
    )
    return [r["link_key"] for r in rows]


async def test_links_list_pages_newest_first_to_the_end(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    newest_first = await _links(conn)
    pages = await _pages(db_dsn, "links", "list", "--limit", "2")
    assert [len(p) for p in pages] == [2, 2, 2, 1]
    assert [row["link_key"] for page in pages for row in page] == newest_first
    whole = await _pages(db_dsn, "links", "list", "--status", "finalized")
    assert [len(p) for p in whole] == [7]


async def test_attempts_list_pages_one_status(conn: asyncpg.Connection, db_dsn: str) -> None:
    install = await insert_pack_install(conn)
    ids = [await insert_attempt(conn, install, link_key=new_link_key()) for _ in range(5)]
    await set_status(conn, "attempt", ids[2], "terminal_failed")
    pages = await _pages(db_dsn, "attempts", "list", "--status", "pending", "--limit", "2")
    assert [len(p) for p in pages] == [2, 2]
    listed = [row["attempt_id"] for page in pages for row in page]
    assert listed == [str(i) for i in reversed(ids) if i != ids[2]]


async def _parked(conn: asyncpg.Connection) -> list[str]:
    """Six parked keys: three terminal attempts and three suspended links, interleaved in
    key order; the terminal ones' keys are returned in key order."""
    install = await insert_pack_install(conn)
    keys = sorted(new_link_key() for _ in range(6))
    for n, key in enumerate(keys):
        if n % 2:
            await insert_link(conn, install, link_key=key)
            await set_status(conn, "link", key, "suspended_drift")
        else:
            attempt = await insert_attempt(conn, install, link_key=key)
            await set_status(conn, "attempt", attempt, "terminal_failed")
    return keys[0::2]


async def test_find_by_park_reason_reads_candidates_until_a_page_is_full(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = await _parked(conn)
    monkeypatch.setattr(link_views, "CANDIDATES", 2)  # several small candidate batches
    reason = ParkReason.TERMINAL_FAILED
    found = [f["link_key"] async for f in link_views.find(conn, None, None, reason, "", 2)]
    assert found == terminal  # a page of two and the one that says there are more
    rest = link_views.find(conn, None, None, reason, terminal[1], 2)
    assert [f["link_key"] async for f in rest] == terminal[2:]


async def test_links_find_pages_by_cursor(conn: asyncpg.Connection, db_dsn: str) -> None:
    terminal = await _parked(conn)
    args = ("links", "find", "--park-reason", "terminal_failed", "--limit", "1")
    pages = await _pages(db_dsn, *args)
    assert [[row["link_key"] for row in page] for page in pages] == [[k] for k in terminal]
    table = await asyncio.to_thread(_invoke, [*args, "--database-url", db_dsn])
    assert table.exit_code == 0, table.output
    assert terminal[0] in table.stdout and "1 link key(s), more follow" in table.stdout
    assert table.stderr.startswith(f"more rows; the next page: connector-push {shlex.join(args)}")
    assert table.stderr.rstrip().endswith("(with your --database-url)")


async def test_audit_pages_newest_first(conn: asyncpg.Connection, db_dsn: str) -> None:
    entry = AuditEntry(
        operator="ops", reason="r", command=AuditCommand.RETIRE, link_key="lk1_x", outcome="ok"
    )
    await audit_q.append_many(conn, [entry] * 5)
    pages = await _pages(db_dsn, "audit", "--link-key", "lk1_x", "--limit", "2")
    assert [len(p) for p in pages] == [2, 2, 1]
    ids = [row["audit_id"] for page in pages for row in page]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 5


async def test_a_cursor_of_another_listing_or_none_at_all_is_bad_input(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    await _links(conn)
    first = await asyncio.to_thread(
        _invoke, ["links", "list", "--limit", "1", "--json", "--database-url", db_dsn]
    )
    cursor = json.loads(first.stderr)["next_cursor"]
    for command in (["audit"], ["attempts", "list"], ["links", "find", "--record-id", "x"]):
        refused = await asyncio.to_thread(
            _invoke, [*command, "--after", cursor, "--database-url", db_dsn]
        )
        assert refused.exit_code == 2 and "not a cursor of this listing" in refused.output
    # Checked before any query: no key Postgres would refuse (a NUL, a time without its
    # zone, an id past bigint) reaches it.
    garbage = [
        (["links", "list"], "not-base64!"),
        (["links", "list"], "W10"),  # []
        (["links", "list"], "WyJsaW5rcyIsMV0"),  # ["links", 1]
        (["links", "list"], "WyJsaW5rcyIsICIyMDI2LTAxLTAxVDAwOjAwOjAwIiwgImxrMV94Il0"),
        (["links", "find", "--record-id", "x"], "WyJmaW5kIiwgImxrMV9cdTAwMDAiXQ"),
        (["audit"], "WyJhdWRpdCIsIDExODA1OTE2MjA3MTc0MTEzMDM0MjRd"),  # 2**70
        (["audit"], "WyJhdWRpdCIsIHRydWVd"),  # true
    ]
    for command, cursor in garbage:
        refused = await asyncio.to_thread(_invoke, [*command, "--after", cursor])
        assert refused.exit_code == 2, (command, cursor, refused.output)
        assert "not a cursor of this listing" in refused.output


async def test_a_reader_that_stops_ends_the_stream_quietly(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    # `connector-push links list --json | head -1`: the reader has gone before the rows
    # are written (its end of the pipe closed first), so the first write fails.
    await _links(conn)
    env = {**os.environ, "DATABASE_URL": db_dsn}
    child = subprocess.Popen(
        [sys.executable, "-m", "cli", "links", "list", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    assert child.stdout is not None
    child.stdout.close()
    _, stderr = await asyncio.to_thread(child.communicate, timeout=60)
    assert (child.returncode, stderr.decode()) == (0, "")
