"""Admission never depends on Temporal (SPEC API-2, WF-2): with the Temporal server
stopped, `connector-push save` and `POST /v1/saves` admit and say the wake-up is
deferred; once Temporal is back the relay dispatches each save, one create each."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from cli.stack.temporal import TemporalDevServer
from tests.e2e.conftest import contact_key, deal_key
from tests.e2e.rig import Rig
from tests.e2e.save_api_support import AUTH, save_body, save_server
from tests.e2e.support import eventually
from tests.e2e.test_relay import _creates, _relay, outage_rig, outage_temporal

__all__ = ["outage_rig", "outage_temporal"]


def _cli_save(dsn: str, rig: Rig, address: str, record_id: str) -> subprocess.CompletedProcess[str]:
    """`connector-push save` as its own process, exactly as an operator or CRM runs it."""
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "TEMPORAL_ADDRESS": address,
        "CONNECTOR_PUSH_TASK_QUEUE": rig.task_queue,
    }
    args = [
        *("--owner-key", "demo-owner", "--action-slot", "push-contact"),
        *("--destination-slot", "remote-contacts", "--source-object", "Contact"),
        *("--record-id", record_id, "--user", "alice", "--json"),
    ]
    return subprocess.run(
        [sys.executable, "-m", "cli", "save", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_save_command_and_http_api_admit_while_temporal_is_down(
    outage_rig: Rig, outage_temporal: TemporalDevServer, db_dsn: str
) -> None:
    rig, stack = outage_rig, outage_rig.stack
    keys = [contact_key("c-001"), deal_key("o-001")]
    stack.touched.update(keys)
    outage_temporal.stop()

    done = await asyncio.to_thread(_cli_save, db_dsn, rig, outage_temporal.address, "c-001")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "deferred" in done.stderr
    assert json.loads(done.stdout)["kind"] == "create_reserved"
    assert json.loads(done.stdout)["wake"] == "deferred"

    deal = save_body(
        "o-001", actionSlot="push-deal", destinationSlot="remote-deals", sourceObject="Opportunity"
    )
    async with save_server(db_dsn, temporal=(stack.client, stack.task_queue), relay=False) as live:
        response = await live.client.post("/v1/saves", json=deal, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["decision"] == "create_reserved"
    assert response.json()["result"]["wake"] == "deferred" and response.json()["warnings"]
    for key in keys:
        assert (await stack.attempt(key))["status"] == "pending"

    outage_temporal.start()
    await outage_temporal.wait_ready()
    await rig.start_worker()
    assert (await _relay(stack)).woken == 2
    for key in keys:
        await eventually(lambda k=key: stack.attempt(k), lambda a: a["status"] == "finalized")
    assert len(await _creates(stack.sandbox, "contacts")) == 1
    assert len(await _creates(stack.sandbox, "deals")) == 1
