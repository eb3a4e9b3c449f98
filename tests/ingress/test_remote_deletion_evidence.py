"""SPEC G-8 (evidence follows the link): a remote-deletion event is recorded whatever the
state of the links naming its object, even with none, and reconcile, revalidate and
`links show` consult that record. Real Postgres, Temporal, ingress and sandbox remote."""

from __future__ import annotations

import asyncio
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.client import WorkflowUpdateFailedError
from typer.testing import CliRunner

from cli.main import app
from protocol.messages import ReconcileInput, RevalidateInput
from protocol.retention import PruneInput
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.retention import prune
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.evidence_support import refusal_chain, status_of
from tests.e2e.patch_support import apply_edit, credential_ref, finalized_contact, suspended
from tests.e2e.support import eventually
from tests.ingress.support import (
    DELETION_ROUTE,
    Live,
    config_from,
    encode,
    event,
    live_server,
    policy_document,
    signed_headers,
)
from workflows.link import LinkWorkflow

PATH = "/webhooks/crm"
COMPANIES = "/crm/v3/objects/companies"


def _config_with_company_deletions() -> Any:
    document = policy_document()
    routes = document["endpoints"][0]["routes"]
    routes["company.deletion"] = {**DELETION_ROUTE, "target_object": "companies"}
    return config_from(document)


async def _deleted_remotely(stack: Stack, db_dsn: str, object_type: str, remote_id: str) -> str:
    """Deliver a signed `<object>.deletion` webhook for `remote_id`; the event once settled."""
    document = event(
        event_id=secrets.randbelow(10**12),
        object_id=int(remote_id),
        subscriptionType=f"{object_type}.deletion",
    )
    temporal = (stack.client, stack.task_queue)
    config = _config_with_company_deletions()
    async with live_server(config, db_dsn, temporal=temporal, relay=False) as live:
        response = await _post(live, [document])
        assert response.status_code == 202, response.text
        event_id = str(response.json()["receipts"][0]["eventId"])
        await eventually(lambda: _event(stack.pool, event_id), lambda r: r["status"] != "admitted")
    return event_id


async def _post(live: Live, document: object) -> httpx.Response:
    body = encode(document)
    return await live.client.post(PATH, content=body, headers=signed_headers(body, PATH))


async def _event(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM connector_event WHERE event_id = $1", event_id)
    assert row is not None
    return row


async def _deletions(pool: asyncpg.Pool, remote_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT * FROM connector_remote_deletion WHERE remote_id = $1 ORDER BY recorded_at",
        remote_id,
    )


async def test_g8_a_deletion_no_link_owns_is_recorded_and_outlives_prune(
    stack: Stack, db_dsn: str
) -> None:
    """G-8: no link names the object: the event is skipped as before, but recorded, and
    the record stays when retention prunes the finished event row."""
    remote_id = str(880_000 + secrets.randbelow(10_000))
    event_id = await _deleted_remotely(stack, db_dsn, "contact", remote_id)
    row = await _event(stack.pool, event_id)
    assert (row["status"], row["status_reason"]) == ("skipped", "no_finalized_link")
    [recorded] = await _deletions(stack.pool, remote_id)
    assert (recorded["event_id"], recorded["target_object"], recorded["remote_scope"]) == (
        event_id,
        "contacts",
        "sandbox-portal",
    )

    async with stack.pool.acquire() as conn:
        await prune(conn, PruneInput(older_than_seconds=0), datetime.now(UTC))
        gone = await conn.fetchval(
            "SELECT count(*) FROM connector_event WHERE event_id = $1", event_id
        )
        assert gone == 0
        # Append-only: the evidence cannot be deleted either.
        with pytest.raises(asyncpg.PostgresError, match="append-only"):
            await conn.execute(
                "DELETE FROM connector_remote_deletion WHERE event_id = $1", event_id
            )
    assert [r["event_id"] for r in await _deletions(stack.pool, remote_id)] == [event_id]


async def _ambiguous_company(stack: Stack) -> tuple[str, str]:
    """a-002 parked ambiguous by a lost answer; the id of the object its POST made."""
    await stack.push("c-002")  # the company's primary contact (LANE-2)
    await status_of(stack, contact_key("c-002"), "finalized")
    before = {e.object_id for e in await stack.sandbox.ledger(object_type="companies")}
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="reset_after_effect", nth=1)
    )
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    key = company_key("a-002")
    await status_of(stack, key, "ambiguous_remote_effect")
    await eventually(
        lambda: stack.handle(key).query(LinkWorkflow.state), lambda v: v.needs_operator
    )
    made = [
        e.object_id
        for e in await stack.sandbox.ledger(object_type="companies", kind="create")
        if e.object_id not in before
    ]
    assert len(made) == 1 and made[0] is not None
    return key, made[0]


async def test_g8_reconcile_refuses_an_object_deleted_while_the_link_was_parked(
    stack: Stack, db_dsn: str
) -> None:
    """G-8: the object a parked create made is deleted at the remote before the operator
    reconciles: the event (no finalized link) is recorded, and reconcile to that id is
    refused naming it, leaving the attempt parked."""
    key, remote_id = await _ambiguous_company(stack)
    event_id = await _deleted_remotely(stack, db_dsn, "company", remote_id)
    assert (await _event(stack.pool, event_id))["status_reason"] == "no_finalized_link"

    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await stack.handle(key).execute_update(
            LinkWorkflow.reconcile,
            ReconcileInput(operator="ops", reason="found it", remote_id=remote_id, evidence="e"),
        )
    message = refusal_chain(refused.value)
    assert f"companies {remote_id} in sandbox-portal was deleted at the remote" in message
    assert event_id in message and "nothing changed" in message
    attempt = await stack.attempt(key)
    assert attempt["status"] == "ambiguous_remote_effect" and attempt["remote_id"] is None


async def test_g8_revalidate_refuses_a_link_whose_object_was_deleted_while_suspended(
    stack: Stack, remote: BackgroundSandbox, db_dsn: str
) -> None:
    """G-8: a drift-suspended link is not finalized, so its deletion event suspends
    nothing (ING-6), but it is recorded: `revalidate-link` refuses to restore the link,
    and `links show` lists the event."""
    link = await finalized_contact(stack)
    key = link["link_key"]
    await apply_edit(stack.pool, remote, credential_ref)
    await stack.push("c-001")
    assert (await suspended(stack, key)) is not None
    event_id = await _deleted_remotely(stack, db_dsn, "contact", str(link["remote_id"]))
    assert (await _event(stack.pool, event_id))["status_reason"] == "no_finalized_link"

    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            LinkWorkflow.revalidate, RevalidateInput(operator="ops", reason="credential rotated")
        )
    message = refusal_chain(refused.value)
    assert "not revalidated" in message and event_id in message, message
    after = await stack.link(key)
    assert after is not None and after["status"] == "suspended_drift"

    shown = await asyncio.to_thread(
        CliRunner().invoke, app, ["links", "show", key, "--json", "--database-url", db_dsn]
    )
    assert shown.exit_code == 0, shown.output
    deletions = json.loads(shown.output)["remote_deletions"]
    assert [(d["event_id"], d["remote_id"]) for d in deletions] == [
        (event_id, str(link["remote_id"]))
    ]
