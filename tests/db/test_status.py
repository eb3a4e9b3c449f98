"""Issue 14 item 4: the status snapshot from real Postgres, the same numbers in
`connector-push status --json` and as gauges on a real Prometheus endpoint."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from typer.testing import CliRunner

from cli.main import app
from cli.stack.process import free_port
from services.status import read_status
from tests.db.rows import (
    insert_attempt,
    insert_link,
    insert_pack_install,
    insert_patch,
    new_link_key,
    set_status,
)
from tests.e2e.support import eventually
from worker.status_gauges import StatusGauges, publish_status


async def _world(conn: asyncpg.Connection) -> dict[str, Any]:
    pack = await insert_pack_install(conn)
    finalized = [await insert_link(conn, pack) for _ in range(3)]
    suspended = [await insert_link(conn, pack) for _ in range(3)]
    for key, reason in zip(
        suspended, ["drift:endpoint", "drift:endpoint", "remote_deleted"], strict=True
    ):
        await set_status(conn, "link", key, "suspended_drift")
        await conn.execute(
            "UPDATE connector_remote_link SET suspend_reason = $2 WHERE link_key = $1", key, reason
        )
    parked = new_link_key()
    attempt = await insert_attempt(conn, pack, link_key=parked)
    await set_status(conn, "attempt", attempt, "terminal_failed")
    await insert_attempt(conn, pack, link_key=new_link_key())  # pending: queue depth
    await insert_patch(conn, link_key=finalized[0])  # pending PATCH
    # The oldest parked item: the first suspension, two hours ago (the touch trigger
    # would stamp now(), so it is held off for this one write).
    async with conn.transaction():
        await conn.execute(
            "ALTER TABLE connector_remote_link DISABLE TRIGGER connector_remote_link_touch_tg"
        )
        await conn.execute(
            "UPDATE connector_remote_link SET updated_at = now() - interval '2 hours'"
            " WHERE link_key = $1",
            suspended[0],
        )
        await conn.execute(
            "ALTER TABLE connector_remote_link ENABLE TRIGGER connector_remote_link_touch_tg"
        )
    return {"suspended": suspended, "parked": parked}


async def test_the_snapshot_counts_what_waits_and_moves(conn: asyncpg.Connection) -> None:
    world = await _world(conn)
    s = await read_status(conn, datetime.now(UTC))
    assert s.links_by_state == {"finalized": 3, "suspended_drift": 3}
    assert s.suspended_by_surface == {"drift:endpoint": 2, "remote_deleted": 1}
    assert s.parked_by_reason == {"terminal_failed": 1}
    assert (s.pending_attempts, s.pending_patches) == (1, 1)
    assert s.oldest_parked is not None
    assert (s.oldest_parked.link_key, s.oldest_parked.reason) == (
        world["suspended"][0],
        "drift:endpoint",
    )


def _cli(*args: str) -> Any:
    return asyncio.to_thread(CliRunner().invoke, app, ["status", *args])


async def test_status_json_and_table_show_the_same_numbers(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    await _world(conn)
    answer = await _cli("--json", "--database-url", db_dsn)
    assert answer.exit_code == 0, answer.output
    data = json.loads(answer.output)
    assert data["suspended_by_surface"] == {"drift:endpoint": 2, "remote_deleted": 1}
    assert data["ingress_unavailable_total"] is None
    table = await _cli("--database-url", db_dsn)
    assert table.exit_code == 0, table.output
    for text in ("links by state", "drift:endpoint", "terminal_failed", "oldest parked"):
        assert text in table.output


def _gauge(text: str, name: str, labels: str) -> float | None:
    """The value of `name` whose label set contains `labels` (the SDK adds service_name)."""
    for found in re.finditer(rf"^{name}\{{([^}}]*)\}} ([0-9.e+-]+)$", text, re.M):
        if labels in found.group(1).split(","):
            return float(found.group(2))
    return None


async def test_the_same_numbers_are_prometheus_gauges(conn: asyncpg.Connection) -> None:
    await _world(conn)
    bind = f"127.0.0.1:{free_port()}"
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))
    published = StatusGauges(runtime.metric_meter)
    now = datetime.now(UTC)
    published.publish(await read_status(conn, now), now)

    async def scrape() -> str:
        async with httpx.AsyncClient(timeout=5.0) as http:
            return (await http.get(f"http://{bind}/metrics")).text

    text = await eventually(scrape, lambda t: "connector_push_status_links" in t)
    assert _gauge(text, "connector_push_status_links", 'state="finalized"') == 3
    assert _gauge(text, "connector_push_status_suspended", 'surface="drift:endpoint"') == 2
    assert _gauge(text, "connector_push_status_parked", 'reason="terminal_failed"') == 1
    assert _gauge(text, "connector_push_status_queue_depth", 'kind="patch"') == 1
    age = _gauge(
        text, "connector_push_status_oldest_parked_age_seconds", 'service_name="temporal-core-sdk"'
    )
    assert age is not None and age >= 7000
    # A reason that is gone is set back to 0, not left at its last value.
    await conn.execute("UPDATE connector_remote_link SET suspend_reason = 'drift:mapping'")
    now = datetime.now(UTC)
    published.publish(await read_status(conn, now), now)
    text = await eventually(
        scrape,
        lambda t: _gauge(t, "connector_push_status_suspended", 'surface="remote_deleted"') == 0,
    )
    assert _gauge(text, "connector_push_status_suspended", 'surface="drift:mapping"') == 3


async def test_the_worker_loop_publishes_until_stopped(
    conn: asyncpg.Connection, db_pool: asyncpg.Pool
) -> None:
    await _world(conn)
    bind = f"127.0.0.1:{free_port()}"
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))
    stop = asyncio.Event()
    loop = asyncio.create_task(publish_status(db_pool, runtime.metric_meter, stop))

    async def scrape() -> str:
        async with httpx.AsyncClient(timeout=5.0) as http:
            return (await http.get(f"http://{bind}/metrics")).text

    text = await eventually(scrape, lambda t: "connector_push_status_links" in t)
    assert _gauge(text, "connector_push_status_parked", 'reason="terminal_failed"') == 1
    stop.set()
    await asyncio.wait_for(loop, timeout=10)  # the loop ends on stop, not on its next tick
