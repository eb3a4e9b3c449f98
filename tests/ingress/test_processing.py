"""Processing admitted events (ING-6): each ends processed / skipped / dead with a reason,
the response never waits on Temporal, and a relay starts what the ingress could not."""

from __future__ import annotations

import logging
import secrets
import time
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from cli.stack.process import free_port
from ingress.config import TemporalTarget
from ingress.dispatch import WorkflowStarter
from ingress.relay import Relay
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.support import eventually
from tests.ingress.support import Live, encode, event, live_server, make_config, signed_headers

PATH = "/webhooks/crm"


def unique_event(**fields: Any) -> dict[str, Any]:
    """Event ids are per test: processing workflow ids are shared by the session's server."""
    return event(event_id=secrets.randbelow(10**12), **fields)


async def post(live: Live, document: object) -> httpx.Response:
    body = encode(document)
    return await live.client.post(PATH, content=body, headers=signed_headers(body, PATH))


async def event_row(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM connector_event WHERE event_id = $1", event_id)
    assert row is not None
    return row


async def settled(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record:
    return await eventually(lambda: event_row(pool, event_id), lambda r: r["status"] != "admitted")


async def finalized_remote_id(stack: Stack, record_id: str) -> str:
    await stack.push(record_id)
    link = await eventually(
        lambda: stack.link(contact_key(record_id)),
        lambda r: r is not None and r["status"] == "finalized",
    )
    return str(link["remote_id"])


async def test_remote_deletion_suspends_the_finalized_link_through_its_workflow(
    stack: Stack, db_dsn: str
) -> None:
    remote_id = await finalized_remote_id(stack, "c-001")
    temporal = (stack.client, stack.task_queue)
    async with live_server(make_config(), db_dsn, temporal=temporal, relay=False) as live:
        response = await post(live, [unique_event(object_id=int(remote_id))])
        assert response.status_code == 202
        event_id = response.json()["receipts"][0]["eventId"]
        row = await settled(stack.pool, event_id)

    assert (row["status"], row["status_reason"]) == ("processed", "link_suspend_signalled")
    assert row["workflow_started_at"] is not None  # started by the ingress, not a relay
    link = await eventually(
        lambda: stack.link(contact_key("c-001")),
        lambda r: r is not None and r["status"] == "suspended_drift",
    )
    assert link["suspend_reason"] == "remote_deleted"


async def test_events_no_link_owns_are_skipped_and_leave_links_alone(
    stack: Stack, db_dsn: str
) -> None:
    remote_id = await finalized_remote_id(stack, "c-002")
    change = unique_event(
        object_id=int(remote_id),
        subscriptionType="contact.propertyChange",
        propertyName="email",
        propertyValue="new@example.test",
    )
    unowned = unique_event(object_id=int(remote_id) + 1000)
    # The same object id in another portal is another object: it suspends nothing.
    other_portal = unique_event(object_id=int(remote_id), portalId=43)
    temporal = (stack.client, stack.task_queue)
    async with live_server(make_config(), db_dsn, temporal=temporal, relay=False) as live:
        response = await post(live, [change, unowned, other_portal])
        assert response.status_code == 202
        ids = [r["eventId"] for r in response.json()["receipts"]]
        rows = [await settled(stack.pool, event_id) for event_id in ids]

    assert [(r["status"], r["status_reason"]) for r in rows] == [
        ("skipped", "no_inbound_mapping"),
        ("skipped", "no_finalized_link"),
        ("skipped", "unmapped_remote_scope"),
    ]
    link = await stack.link(contact_key("c-002"))
    assert link is not None and link["status"] == "finalized"


async def test_relay_starts_the_workflows_an_unreachable_temporal_did_not(
    stack: Stack, db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config()
    nowhere = TemporalTarget(address=f"127.0.0.1:{free_port()}", task_queue=stack.task_queue)
    async with live_server(config, db_dsn, temporal=nowhere, relay=False) as live:
        started = time.monotonic()
        response = await post(live, [unique_event(), unique_event(object_id=7)])
        answered_in = time.monotonic() - started
        with caplog.at_level(logging.WARNING, logger="ingress.dispatch"):
            # More failed starts: the log says so once per interval, not once each.
            for _ in range(3):
                assert (await post(live, [unique_event()])).status_code == 202
            await live.ingress.background.idle()  # the failed starts are over
    failures = [r for r in caplog.records if "could not start event workflow" in r.getMessage()]
    assert len(failures) <= 1
    assert response.status_code == 202
    assert answered_in < 0.75  # the 2xx did not wait for the start attempt
    ids = [r["eventId"] for r in response.json()["receipts"]]
    before = [await event_row(stack.pool, event_id) for event_id in ids]
    assert [(r["status"], r["workflow_started_at"]) for r in before] == [("admitted", None)] * 2

    relay = Relay(
        WorkflowStarter(stack.client, stack.task_queue, config.policy), min_age=timedelta(0)
    )
    assert await relay.run_once(stack.pool) == 5  # every failed start, relayed
    rows = [await settled(stack.pool, event_id) for event_id in ids]
    assert {(r["status"], r["status_reason"]) for r in rows} == {("skipped", "no_finalized_link")}
    assert all(r["workflow_started_at"] is not None for r in rows)
    assert await relay.run_once(stack.pool) == 0  # nothing left to relay
