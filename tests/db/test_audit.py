"""SPEC OPS-2 against real Postgres: the audit trail is append-only and every bulk or pack
operator action appends to it in its own transaction (operator updates: tests/e2e/test_audit.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner

from cli.main import app
from db import audit as q
from db.errors import AppendOnlyViolationError, invariant_errors
from protocol.audit import AuditCommand, AuditEntry
from services.packs import apply_pack
from services.revalidation import apply, validate
from tests.db.revalidation_support import Links, make_links, plan
from tests.unit.factories import demo_document


@pytest.fixture
async def links(conn: asyncpg.Connection) -> Links:
    return await make_links(conn)


async def _rows(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch("SELECT * FROM connector_operator_audit ORDER BY audit_id")
    return [dict(r) for r in rows]


ENTRY = AuditEntry(
    operator="ops", reason="incident 7", command=AuditCommand.RETIRE, link_key="lk1_x", outcome="ok"
)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE connector_operator_audit SET reason = 'rewritten'",
        "DELETE FROM connector_operator_audit",
        "TRUNCATE connector_operator_audit",
    ],
)
async def test_the_trail_refuses_updates_deletes_and_truncation(
    conn: asyncpg.Connection, statement: str
) -> None:
    await q.append(conn, ENTRY)
    before = await _rows(conn)
    with pytest.raises(AppendOnlyViolationError, match="append-only"), invariant_errors():
        await conn.execute(statement)
    assert await _rows(conn) == before


async def test_pack_apply_appends_one_entry_per_install_and_none_when_unchanged(
    conn: asyncpg.Connection,
) -> None:
    first = await apply_pack(conn, demo_document(), operator="alice", reason="go live")
    await apply_pack(conn, demo_document(), operator="alice")  # unchanged: nothing written
    again = await apply_pack(conn, demo_document(), reinstall=True, operator="bob", reason="new")
    rows = await _rows(conn)
    assert [(r["operator"], r["command"], r["reason"]) for r in rows] == [
        ("alice", "pack-apply", "go live"),
        ("bob", "pack-apply", "new"),
    ]
    assert rows[0]["state_before"] is None
    after = json.loads(rows[1]["state_after"])
    assert json.loads(rows[1]["state_before"])["active_pack_install_id"] == first.pack_install_id
    assert after["active_pack_install_id"] == again.pack_install_id
    assert json.loads(rows[1]["arguments"])["reinstall"] is True


async def test_revalidate_apply_audits_each_member_and_validate_or_retry_audit_nothing(
    conn: asyncpg.Connection,
    links: Links,
) -> None:
    manifest = await plan(conn, links, links.keys)
    assert (await validate(conn, manifest)).receipts
    assert await _rows(conn) == []
    result = await apply(conn, manifest)
    await apply(conn, manifest)  # already applied: verify-only
    rows = await _rows(conn)
    assert [r["link_key"] for r in rows] == links.keys
    assert {(r["operator"], r["reason"], r["command"]) for r in rows} == {
        ("alice", "mapping v2", "revalidate-apply")
    }
    receipt, row = result.receipts[0], rows[0]
    assert json.loads(row["state_before"])["body_fingerprint"] == receipt.old_body_fingerprint
    assert json.loads(row["state_after"])["body_fingerprint"] == receipt.new_body_fingerprint
    assert json.loads(row["arguments"])["operation_id"] == "op-1"
    stamped = await conn.fetch(
        "SELECT last_operator, last_operator_reason FROM connector_remote_link"
    )
    assert {tuple(r) for r in stamped} == {("alice", "mapping v2")}  # the link's operator too


async def test_a_rejected_revalidation_appends_nothing(
    conn: asyncpg.Connection,
    links: Links,
) -> None:
    manifest = await plan(conn, links, links.keys)
    await conn.execute(
        "UPDATE connector_remote_link SET update_path_template = '/v2/{remoteId}'"
        " WHERE link_key = $1",
        links.keys[2],
    )
    assert (await apply(conn, manifest)).conflicts
    assert await _rows(conn) == []


def _lines(stdout: str) -> list[Any]:
    """`--json` output: JSON Lines, one entry a line (issue 34 item 4)."""
    return [json.loads(line) for line in stdout.splitlines()]


def _audit(*args: str) -> Any:
    return asyncio.to_thread(CliRunner().invoke, app, ["audit", *args])


async def test_the_audit_command_filters_by_link_and_time(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    await q.append(conn, ENTRY)
    await q.append(conn, ENTRY.model_copy(update={"link_key": "lk1_y", "operator": "eve"}))
    listed = await _audit("--link-key", "lk1_y", "--json", "--database-url", db_dsn)
    assert listed.exit_code == 0, listed.output
    assert [e["operator"] for e in _lines(listed.stdout)] == ["eve"]
    recent = await _audit("--since", "1h", "--json", "--database-url", db_dsn)
    assert [e["operator"] for e in _lines(recent.stdout)] == ["eve", "ops"]  # newest first
    future = await _audit("--since", "2999-01-01", "--json", "--database-url", db_dsn)
    assert (future.exit_code, future.stdout, future.stderr) == (0, "", "")
    table = await _audit("--database-url", db_dsn)
    assert table.exit_code == 0 and "incident 7" in table.output and "retire" in table.output
    bad = await _audit("--since", "yesterday", "--database-url", db_dsn)
    assert bad.exit_code == 2 and "--since" in bad.output and "Traceback" not in bad.output


async def test_many_entries_append_in_one_statement_one_row_each_in_order(
    conn: asyncpg.Connection,
) -> None:
    entries = [
        ENTRY,
        ENTRY.model_copy(update={"link_key": None, "command": AuditCommand.PACK_APPLY}),
        ENTRY.model_copy(
            update={
                "link_key": "lk1_y",
                "arguments": {"operation_id": "op-1", "n": 2},
                "state_before": {"b": None},
                "state_after": ["é", 1.5],
            }
        ),
    ]
    await q.append_many(conn, entries)
    stored = await q.entries(conn, None, None, 10)
    # `host` is filled in by the writer (S-5: tests/db/test_audit_identity.py)
    assert [AuditEntry.model_validate(r.model_dump(include=set(AuditEntry.model_fields) - {"host"}))
            for r in reversed(stored)] == entries  # fmt: skip
    assert [r.audit_id for r in reversed(stored)] == sorted(r.audit_id for r in stored)
    await q.append_many(conn, [])
    assert len(await q.entries(conn, None, None, 10)) == 3
