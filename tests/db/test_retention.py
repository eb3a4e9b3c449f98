"""SPEC OPS-3 against real Postgres: prune deletes finished rows past the cut, in batches,
and nothing else; the database guards still refuse every protected delete."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner

from cli.main import app
from db import audit as audit_q
from db import journal as jq
from protocol.audit import AuditCommand, AuditEntry
from protocol.retention import PruneInput
from services.retention import prune
from tests.db.rows import (
    insert_attempt,
    insert_event,
    insert_link,
    insert_pack_install,
    new_link_key,
    set_status,
)

THIRTY_DAYS = int(timedelta(days=30).total_seconds())
LATER = datetime.now(UTC) + timedelta(days=41)  # everything written now is 41 days old then
TABLES = (
    "connector_remote_link",
    "connector_push_attempt",
    "connector_patch_dispatch",
    "connector_send_journal",
    "connector_event",
    "ingress_receipt",
    "workflow_action_execution",
    "connector_operator_audit",
    "connector_link_revalidation_receipt",
)


async def _counts(conn: asyncpg.Connection) -> dict[str, int]:
    return {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES}


async def _receipt(conn: asyncpg.Connection, event_id: str | None) -> str:
    receipt_id = f"rc1_{uuid.uuid4().hex}"
    await conn.execute(
        "INSERT INTO ingress_receipt (receipt_id, endpoint, request_id, event_id, payload)"
        " VALUES ($1, 'crm', $2, $3, '{}')",
        receipt_id,
        uuid.uuid4().hex,
        event_id,
    )
    return receipt_id


async def _execution(conn: asyncpg.Connection, receipt_id: str, phase: str) -> str:
    execution_id = f"ax1_{uuid.uuid4().hex}"
    await conn.execute(
        "INSERT INTO workflow_action_execution (execution_id, endpoint, callback_id, action_id,"
        " receipt_id, payload, expires_at, phase) VALUES ($1, 'crm', $2, 'act', $3, '{}',"
        " now() + interval '1 hour', $4)",
        execution_id,
        uuid.uuid4().hex,
        receipt_id,
        phase,
    )
    return execution_id


async def _patches(conn: asyncpg.Connection, link_key: str, n: int) -> list[uuid.UUID]:
    """`n` PATCH ids of one link, oldest first by explicit creation time; each is inserted
    pending by `_insert_patch` when the test is ready for it (one pending per link)."""
    return [uuid.uuid4() for _ in range(n)]


async def _insert_patch(
    conn: asyncpg.Connection, link_key: str, patch_id: uuid.UUID, age_s: float
) -> None:
    await conn.execute(
        "INSERT INTO connector_patch_dispatch (patch_id, link_key, status, created_at)"
        " VALUES ($1, $2, 'pending', now() - make_interval(secs => $3))",
        patch_id,
        link_key,
        age_s,
    )


async def _claim(conn: asyncpg.Connection, patch_id: uuid.UUID) -> int:
    token = uuid.uuid4()
    await conn.execute(
        "UPDATE connector_patch_dispatch SET status = 'processing', claim_token = $2, "
        "profile_snapshot = '{}'::jsonb WHERE patch_id = $1",
        patch_id,
        token,
    )
    journal_id = await jq.checkpoint_patch(conn, patch_id, token)
    assert journal_id is not None
    return journal_id


async def _set_patch(conn: asyncpg.Connection, patch_id: uuid.UUID, status: str) -> None:
    await conn.execute(
        "UPDATE connector_patch_dispatch SET status = $2 WHERE patch_id = $1", patch_id, status
    )


async def _world(conn: asyncpg.Connection) -> dict[str, Any]:
    """Finished and unfinished rows of every kind; see each comment for its fate."""
    pack = await insert_pack_install(conn)
    link = await insert_link(conn, pack)
    patches = await _patches(conn, link, 25)  # the newest 20 stay whatever they are
    age = {p: float(25 - i) for i, p in enumerate(patches)}
    await _insert_patch(conn, link, patches[0], age[patches[0]])
    await _claim(conn, patches[0])
    await _set_patch(conn, patches[0], "ambiguous_remote_effect")  # unresolved: stays
    await _insert_patch(conn, link, patches[2], age[patches[2]])
    journal = await _claim(conn, patches[2])
    assert await jq.record_outcome(conn, journal, "answered", 200, None, None)
    await _set_patch(conn, patches[2], "succeeded")  # goes, with its journal row
    for patch_id in patches[3:]:
        await _insert_patch(conn, link, patch_id, age[patch_id])
        await _set_patch(conn, patch_id, "superseded")  # [3], [4] go; [5:] are the newest 20
    await _insert_patch(conn, link, patches[1], age[patches[1]])  # pending, unfinished: stays
    # An attempt with a journal row: attempts and their journal are never pruned.
    attempt = await insert_attempt(conn, pack, link_key=new_link_key(), status="pending")
    claimed = await jq.claim_for_send(conn, str(attempt), uuid.uuid4(), checkpoint=True)
    assert claimed is not None
    processed, admitted, acted = [await insert_event(conn) for _ in range(3)]
    for event_id in (processed, acted):
        await set_status(conn, "event", event_id, "processed")
    world = {
        "pack": pack,
        "link": link,
        "patches": patches,
        "processed": processed,  # goes, with its receipt
        "admitted": admitted,  # stays, with its receipt
        "acted": acted,  # goes once its delivered execution is gone
        "receipts": {
            "processed": await _receipt(conn, processed),
            "admitted": await _receipt(conn, admitted),
            "unrouted": await _receipt(conn, None),  # goes
            "acted": await _receipt(conn, acted),
            "waiting": await _receipt(conn, None),  # stays: its execution is unfinished
        },
    }
    world["delivered"] = await _execution(conn, world["receipts"]["acted"], "delivered")
    world["enqueued"] = await _execution(conn, world["receipts"]["waiting"], "enqueued")
    entry = AuditEntry(operator="ops", reason="r", command=AuditCommand.RETIRE, outcome="ok")
    await audit_q.append(conn, entry)
    return world


EXPECTED = {
    "ingress_receipts": 3,
    "events": 2,
    "patches": 3,
    "patch_journal": 1,
    "action_executions": 1,
    "save_answers": 0,  # S-7: tests/db/test_retention_save_answers.py
}


async def test_prune_deletes_only_finished_rows_past_the_cut_in_batches(
    conn: asyncpg.Connection,
) -> None:
    world = await _world(conn)
    before = await _counts(conn)
    request = PruneInput(older_than_seconds=THIRTY_DAYS, batch_size=2)
    recent = await prune(conn, request, datetime.now(UTC))
    assert all(v == 0 for v in recent.counts.model_dump().values())
    dry = await prune(conn, request.model_copy(update={"dry_run": True}), LATER)
    assert dry.dry_run and dry.counts.model_dump() == EXPECTED
    assert await _counts(conn) == before
    report = await prune(conn, request, LATER)
    assert report.counts.model_dump() == EXPECTED
    after = await _counts(conn)
    gone = {t: before[t] - after[t] for t in TABLES}
    assert gone == {
        **dict.fromkeys(TABLES, 0),
        "connector_patch_dispatch": 3,
        "connector_send_journal": 1,
        "connector_event": 2,
        "ingress_receipt": 3,
        "workflow_action_execution": 1,
    }
    kept = {
        r["patch_id"] for r in await conn.fetch("SELECT patch_id FROM connector_patch_dispatch")
    }
    assert kept == set(world["patches"]) - set(world["patches"][2:5])
    events = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM connector_event")}
    assert events == {world["admitted"]}
    receipts = {r["receipt_id"] for r in await conn.fetch("SELECT receipt_id FROM ingress_receipt")}
    assert receipts == {world["receipts"]["admitted"], world["receipts"]["waiting"]}
    again = await prune(conn, request, LATER)
    assert all(v == 0 for v in again.counts.model_dump().values())


async def _refused(conn: asyncpg.Connection, sql: str, *args: object) -> str:
    with pytest.raises(asyncpg.PostgresError) as raised:
        async with conn.transaction():
            await conn.execute(sql, *args)
    return str(raised.value.sqlstate)


async def test_the_guards_still_refuse_protected_deletes(conn: asyncpg.Connection) -> None:
    w = await _world(conn)
    before = await _counts(conn)
    refusals = [
        ("DELETE FROM connector_remote_link WHERE link_key = $1", w["link"], "CP004"),
        ("DELETE FROM connector_push_attempt", None, "CP004"),
        ("DELETE FROM connector_patch_dispatch WHERE patch_id = $1", w["patches"][1], "CP004"),
        # G-3: the ambiguous PATCH (its answer was lost) and its journal row, which prune skips
        ("DELETE FROM connector_patch_dispatch WHERE patch_id = $1", w["patches"][0], "CP004"),
        ("DELETE FROM connector_send_journal WHERE patch_id = $1", w["patches"][0], "CP004"),
        # the journal of the unresolved (pending, checkpointed) attempt
        ("DELETE FROM connector_send_journal WHERE attempt_id IS NOT NULL", None, "CP004"),
        ("DELETE FROM connector_operator_audit", None, "CP003"),
        ("DELETE FROM connector_event WHERE event_id = $1", w["admitted"], "42501"),
        ("TRUNCATE connector_event CASCADE", None, "42501"),
        ("DELETE FROM ingress_receipt WHERE receipt_id = $1", w["receipts"]["admitted"], "42501"),
        ("UPDATE ingress_receipt SET payload = 'x'", None, "42501"),
        ("DELETE FROM workflow_action_execution WHERE execution_id = $1", w["enqueued"], "42501"),
    ]
    for sql, arg, code in refusals:
        assert await _refused(conn, sql, *([arg] if arg is not None else [])) == code, sql
    assert await _counts(conn) == before


def _prune(*args: str) -> Any:
    return asyncio.to_thread(CliRunner().invoke, app, ["prune", *args])


async def test_the_prune_command_reports_and_refuses_a_bad_age(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    await _world(conn)
    before = await _counts(conn)
    dry = await _prune("--older-than", "30d", "--dry-run", "--json", "--database-url", db_dsn)
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["counts"] == dict.fromkeys(EXPECTED, 0)  # all rows are new
    table = await _prune("--older-than", "1s", "--dry-run", "--database-url", db_dsn)
    assert table.exit_code == 0 and "would delete" in table.output
    assert await _counts(conn) == before
    bad = await _prune("--older-than", "a month", "--database-url", db_dsn)
    assert bad.exit_code == 2 and "--older-than" in bad.output and "Traceback" not in bad.output
