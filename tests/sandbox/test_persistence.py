"""`persist_path`: a restarted sandbox keeps objects, ids, ledger and idempotency records."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from sandbox.client import SandboxClient
from tests.sandbox.conftest import StartSandbox
from tests.sandbox.support import CONTACTS, contact, make_config


async def test_restart_keeps_objects_id_counter_ledger_and_idempotency(
    start_sandbox: StartSandbox, tmp_path: Path
) -> None:
    config = make_config(persist_path=tmp_path / "state" / "sandbox.json")
    headers = {"Idempotency-Key": "k-1"}
    first = start_sandbox(config)
    async with httpx.AsyncClient(base_url=first.url, timeout=10.0) as http:
        created = await http.post(CONTACTS, json=contact("ann@example.com"), headers=headers)
    first.stop()

    second = start_sandbox(config)
    async with httpx.AsyncClient(base_url=second.url, timeout=10.0) as http:
        read = await http.get(f"{CONTACTS}/{created.json()['id']}")
        replay = await http.post(CONTACTS, json=contact("ann@example.com"), headers=headers)
        fresh = await http.post(CONTACTS, json=contact("bo@example.com"))
        ledger = await SandboxClient(second.url, http).ledger()

    assert read.json() == created.json()
    assert replay.json() == created.json()
    assert int(fresh.json()["id"]) == int(created.json()["id"]) + 1
    assert [(e.seq, e.replayed) for e in ledger] == [(1, False), (2, True), (3, False)]


async def test_state_file_is_valid_json_after_every_mutation(
    start_sandbox: StartSandbox, tmp_path: Path
) -> None:
    path = tmp_path / "sandbox.json"
    server = start_sandbox(make_config(persist_path=path))
    async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as http:
        for i in range(3):
            await http.post(CONTACTS, json=contact(f"c{i}@example.com"))
            state = json.loads(path.read_text("utf-8"))
            assert len(state["objects"]["contacts"]) == i + 1
    assert [p.name for p in tmp_path.iterdir()] == ["sandbox.json"]
