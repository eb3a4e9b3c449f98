"""SPEC S-7 end to end: `connector-push forget` erases a record's values from frozen
request bodies, webhook and workflow-action payloads and stored save answers, keeps the
hashes and the evidence that requests were sent, and leaves an audit entry (OPS-2, S-5).
The CLI runs as the operator role (S-4), as a deployment runs it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from typing import Any

import asyncpg
from typer.testing import CliRunner, Result

from cli.main import app
from protocol.canonical import canonical_json, sha256_hex
from tests.db.roles_support import login_dsn, login_name
from tests.e2e.conftest import Stack
from tests.e2e.patch_support import finalized_contact, set_field, settled

ERASED = "connector-push:erased"
WHO = ["--operator", "dpo@example.com", "--reason", "erasure request 17"]
RECORD = ["--source-object", "Contact", "--record-id", "c-001"]


async def _cli(dsn: str, *args: str) -> Result:
    env = {"DATABASE_URL": dsn}
    return await asyncio.to_thread(lambda: CliRunner().invoke(app, list(args), env=env))


async def _inbox_rows(pool: asyncpg.Pool, remote_id: str, key: str) -> None:
    """What the ingress stores about the record's remote object: a webhook event and its
    receipt, a finished workflow action and its receipt, and a stored save answer."""
    payload = json.dumps({"objectId": remote_id, "propertyValue": "ada@example.com"})
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO connector_event (event_id, endpoint, event_type, handler, payload, "
            "first_receipt_id, target_object, remote_object_id) "
            "VALUES ('ev-1', 'crm', 'contact.propertyChange', 'remote_property_change', $1, "
            "'rc-1', 'contacts', $2)",
            payload,
            remote_id,
        )
        await conn.execute(
            "INSERT INTO ingress_receipt (receipt_id, endpoint, request_id, event_id, payload) "
            "VALUES ('rc-1', 'crm', 'rq-1', 'ev-1', $1), ('rc-2', 'actions', 'rq-2', NULL, $1)",
            payload,
        )
        await conn.execute(
            "INSERT INTO workflow_action_execution (execution_id, endpoint, callback_id, "
            "action_id, receipt_id, payload, expires_at, phase, target_object, "
            "remote_object_id) VALUES ('x-1', 'actions', 'cb-1', '22', 'rc-2', $1, now(), "
            "'admitted', 'contacts', $2)",
            payload,
            remote_id,
        )
        await conn.execute(
            "UPDATE connector_event SET status = 'processed', status_reason = 'done'"
        )
        await conn.execute(
            "UPDATE workflow_action_execution SET phase = 'stopped', stop_reason = 'expired'"
        )
        await conn.execute(
            "INSERT INTO save_api_request (client_id, idempotency_key, request_hash, answer) "
            "VALUES ('crm', 'k-1', 'h', $1::jsonb), ('crm', 'k-2', 'h', '{\"result\": {}}')",
            json.dumps({"result": {"link_key": key, "decision": "create_reserved"}}),
        )


async def _one(pool: asyncpg.Pool, sql: str, *args: Any) -> asyncpg.Record:
    row = await pool.fetchrow(sql, *args)
    assert row is not None
    return row


async def test_s7_forget_erases_values_everywhere_and_keeps_hashes_evidence_and_audit(
    stack: Stack, db_dsn: str
) -> None:
    link = await finalized_contact(stack)
    key = link["link_key"]
    await set_field(stack.pool, "Contact", "c-001", "FirstName", "Augusta")
    await stack.push("c-001")
    [patch] = await settled(stack, key)
    await _inbox_rows(stack.pool, link["remote_id"], key)
    attempt = await stack.attempt(key)
    before = json.loads(attempt["request_snapshot"])
    assert "@" in json.dumps(before["body"])  # the contact's email is in the frozen body
    journal = await stack.pool.fetch("SELECT * FROM connector_send_journal ORDER BY journal_id")

    result = await _cli(await login_dsn(db_dsn, "operator"), "forget", *RECORD, *WHO, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["counts"] == {
        "attempts": 1,
        "patches": 1,
        "events": 1,
        "ingress_receipts": 2,
        "action_executions": 1,
        "save_answers": 1,
    }

    after = json.loads((await stack.attempt(key))["request_snapshot"])
    assert after["body"] == ERASED and after["body_hash"] == before["body_hash"]
    assert before["body_hash"] == sha256_hex(canonical_json(before["body"]))
    assert {k: v for k, v in after.items() if k not in ("body", "locator_value")} == {
        k: v for k, v in before.items() if k not in ("body", "locator_value")
    }
    patch_after = await _one(stack.pool, "SELECT * FROM connector_patch_dispatch")
    assert json.loads(patch_after["body"]) == ERASED
    assert patch_after["body_fingerprint"] == patch["body_fingerprint"]
    assert patch_after["status"] == "succeeded" and patch_after["values_erased_at"] is not None
    # The evidence that requests were sent: the journal, untouched.
    assert await stack.pool.fetch("SELECT * FROM connector_send_journal ORDER BY journal_id") == (
        journal
    )
    payload_hash = hashlib.sha256(
        json.dumps({"objectId": link["remote_id"], "propertyValue": "ada@example.com"}).encode()
    ).hexdigest()
    for table in ("connector_event", "ingress_receipt", "workflow_action_execution"):
        rows = await stack.pool.fetch(f"SELECT payload, erased_payload_sha256 FROM {table}")
        assert [(r["payload"], r["erased_payload_sha256"]) for r in rows] == [
            (json.dumps(ERASED), payload_hash)
        ] * len(rows), table
    answers = await stack.pool.fetch("SELECT idempotency_key FROM save_api_request")
    assert [r["idempotency_key"] for r in answers] == ["k-2"]  # another record's stays

    entry = await _one(stack.pool, "SELECT * FROM connector_operator_audit WHERE audit_id = $1",
                       report["audit_id"])  # fmt: skip
    assert (entry["command"], entry["operator"], entry["reason"]) == (
        "forget",
        "dpo@example.com",
        "erasure request 17",
    )
    assert json.loads(entry["arguments"]) == {"source_object": "Contact", "record_id": "c-001"}
    # S-5: what the system knows, beside the declared operator.
    assert entry["db_role"] == entry["db_session_user"] == login_name("operator")
    assert entry["host"] == socket.gethostname()

    again = await _cli(db_dsn, "forget", *RECORD, *WHO, "--json")
    assert json.loads(again.stdout)["counts"]["attempts"] == 0  # erased once, for good


async def test_s7_forget_refuses_while_a_request_may_still_be_sent_and_writes_nothing(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    from protocol.admission import SaveRequest
    from services.save_entry import admit_one

    save = SaveRequest(
        connector_owner_key="demo-owner",
        action_slot_id="push-contact",
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id="c-001",
        originating_user_id="alice",
    )
    await admit_one(demo_db, save)  # no worker: the attempt stays pending
    snapshot = await demo_db.fetchval("SELECT request_snapshot FROM connector_push_attempt_frozen")
    result = await _cli(db_dsn, "forget", *RECORD, *WHO)
    assert result.exit_code == 1
    assert "may still be sent or processed" in result.output and "pending" in result.output
    assert await demo_db.fetchval("SELECT request_snapshot FROM connector_push_attempt_frozen") == (
        snapshot
    )
    assert await demo_db.fetchval("SELECT count(*) FROM connector_operator_audit") == 0


async def test_s7_forget_bad_input_is_exit_2_and_writes_nothing(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    for args in (
        ["--source-object", " ", "--record-id", "c-001"],
        ["--source-object", "Contact", "--record-id", ""],
        ["--source-object", "Contact", "--record-id", "x" * 2000],
        [*RECORD, "--operator", " "],
    ):
        result = await _cli(db_dsn, "forget", *args)
        assert result.exit_code == 2, result.output
    assert await demo_db.fetchval("SELECT count(*) FROM connector_operator_audit") == 0
