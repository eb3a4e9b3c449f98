"""SPEC S-4: the ingress serves as its own database role. It admits webhooks and workflow
actions and marks their workflows started; the same connections cannot rewrite the
audit trail, unguard it, or touch links and attempts."""

from __future__ import annotations

import asyncpg
import pytest
from temporalio.client import Client

from tests.db.roles_support import login_dsn, login_name
from tests.ingress.support import (
    ACTION_SECRET,
    encode,
    event,
    execution,
    live_server,
    make_config,
    signed_headers,
    wait_until,
)


async def test_s4_the_ingress_admits_as_its_role_and_cannot_update_the_audit_trail(
    db_dsn: str, temporal_client: Client, task_queue: str
) -> None:
    ingress_dsn = await login_dsn(db_dsn, "ingress")
    config = make_config()
    admin = await asyncpg.connect(db_dsn)
    try:
        async with live_server(
            config, ingress_dsn, temporal=(temporal_client, task_queue), relay=False
        ) as live:
            body = encode([event(1), event(2)])
            answer = await live.client.post(
                "/webhooks/crm", content=body, headers=signed_headers(body, "/webhooks/crm")
            )
            assert answer.status_code == 202, answer.text
            action = encode(execution("cb-role"))
            headers = signed_headers(action, "/actions/crm", secret=ACTION_SECRET)
            answer = await live.client.post("/actions/crm", content=action, headers=headers)
            assert answer.status_code == 200, answer.text

            async def started() -> bool:  # the after-commit start's UPDATE, as the role
                return bool(await admin.fetchval(
                    "SELECT bool_and(workflow_started_at IS NOT NULL) FROM (SELECT "
                    "workflow_started_at FROM connector_event UNION ALL SELECT "
                    "workflow_started_at FROM workflow_action_execution) s"))  # fmt: skip

            await wait_until(started, what="workflows marked started")
            pool = live.ingress.admitter.pool
            async with pool.acquire() as conn:
                assert await conn.fetchval("SELECT current_user") == login_name("ingress")
                for statement in (
                    "UPDATE connector_operator_audit SET reason = 'rewritten'",
                    "ALTER TABLE connector_operator_audit DISABLE TRIGGER ALL",
                    "SELECT count(*) FROM connector_remote_link",
                    "SELECT count(*) FROM connector_push_attempt",
                ):
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await conn.execute(statement)
        counts = await admin.fetchrow(
            "SELECT (SELECT count(*) FROM connector_event) AS events, "
            "(SELECT count(*) FROM ingress_receipt) AS receipts, "
            "(SELECT count(*) FROM workflow_action_execution) AS executions"
        )
        assert counts is not None
        assert dict(counts) == {"events": 2, "receipts": 3, "executions": 1}
    finally:
        await admin.close()
