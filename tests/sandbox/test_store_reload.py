"""The objects' unique values survive a restart from the persist file (the store's index is
rebuilt from the loaded state, not only kept in step with this process's writes)."""

from __future__ import annotations

import json
from pathlib import Path

from sandbox.config import SandboxConfig
from sandbox.holder import StateHolder
from sandbox.store import ObjectStore


def _store(persist: Path) -> ObjectStore:
    config = SandboxConfig(persist_path=persist)
    return ObjectStore(config, StateHolder(config))


def _contact(email: str) -> bytes:
    return json.dumps({"properties": {"email": email}}).encode()


def test_a_reloaded_state_still_refuses_and_finds_its_unique_values(tmp_path: Path) -> None:
    persist = tmp_path / "state.json"
    first = _store(persist).create("contacts", _contact("kim@example.com"), None)
    assert first.status == 201

    reloaded = _store(persist)
    duplicate = reloaded.create("contacts", _contact("kim@example.com"), None)
    found = reloaded.read("contacts", "kim@example.com", "email")

    assert duplicate.status == 409
    assert found.status == 200
    assert found.body == first.body
