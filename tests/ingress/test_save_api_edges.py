"""Edges an integrator hit in the save API (issue 31): clients sharing a key are refused
at start, a request naming its Idempotency-Key twice is a 400 with nothing written, and
the readback and the OpenAPI document show the save API's clients and limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from cli.stack.process import free_port
from ingress.config import ConfigError, load_config, parse_policy
from tests.e2e.save_api_support import AUTH, CRM_KEY, save_body, save_server, stored
from tests.ingress.support import ENVIRON, policy_document

SHARED_KEY = "shared0save0key0value"
TWO_CLIENTS = {
    "clients": [
        {"name": "crm", "key_env": "TEST_SAVE_KEY_CRM", "owners": ["demo-owner"]},
        {
            "name": "billing",
            "key_env": "TEST_SAVE_KEY_BILLING",
            "owners": ["billing-b", "billing-a"],
            "users": ["carol"],
        },
    ],
    "max_batch": 7,
    "body_limit": 4096,
    "deadline_ms": 2500,
}
NOTHING = {"connector_push_attempt": 0, "connector_patch_dispatch": 0, "save_api_request": 0}


def _policy_file(tmp_path: Path, save_api: dict[str, object]) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_document(save_api=save_api)))
    return path


def test_two_clients_reading_one_key_variable_are_refused_naming_both() -> None:
    section = {
        "clients": [
            {"name": "crm", "key_env": "TEST_SAVE_KEY", "owners": ["o"]},
            {"name": "billing", "key_env": "TEST_SAVE_KEY", "owners": ["o"]},
        ]
    }
    with pytest.raises(ConfigError, match="save_api clients crm and billing read one key_env"):
        parse_policy(yaml.safe_dump(policy_document(save_api=section)))


def test_two_clients_whose_variables_hold_one_key_are_refused_at_start(tmp_path: Path) -> None:
    """Their requests would be taken for one of them and their idempotency scopes would
    merge: the start is refused (exit 2, one line) naming both clients, never the key."""
    path = _policy_file(tmp_path, TWO_CLIENTS)
    shared = {**ENVIRON, "TEST_SAVE_KEY_CRM": SHARED_KEY, "TEST_SAVE_KEY_BILLING": SHARED_KEY}
    with pytest.raises(ConfigError, match="save_api clients crm and billing have the same key"):
        load_config(path, shared)
    load_config(path, {**shared, "TEST_SAVE_KEY_BILLING": "another0key"})  # distinct: loads
    env = {
        **os.environ,
        **shared,
        "DATABASE_URL": f"postgresql://127.0.0.1:{free_port()}/unused",
        "CONNECTOR_PUSH_INGRESS_PORT": str(free_port()),
        "CONNECTOR_PUSH_INGRESS_PROCESSES": "1",
    }
    # Without the check the process would serve (a run that never ends, cut by the timeout).
    started = subprocess.run(
        [sys.executable, "-m", "cli", "ingress", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = started.stdout + started.stderr
    assert started.returncode == 2, output
    [line] = output.strip().splitlines()
    assert "save_api clients crm and billing have the same key" in line
    assert SHARED_KEY not in output and "Traceback" not in output


async def test_an_idempotency_key_given_twice_is_400_naming_the_header_and_writes_nothing(
    db_pool: asyncpg.Pool, db_dsn: str
) -> None:
    twice = [
        *AUTH.items(),
        ("idempotency-key", "first"),
        ("idempotency-key", "second"),
    ]
    async with save_server(db_dsn) as live:
        for route, body in (("/v1/saves", save_body()), ("/v1/saves/batch", None)):
            payload = body if body is not None else {"saves": [save_body()]}
            answer = await live.client.post(route, json=payload, headers=twice)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"] == "invalid_request"
            [problem] = answer.json()["fields"]
            assert problem["path"] == "header:Idempotency-Key"
            assert "more than once" in problem["message"]
        assert await stored(db_pool) == NOTHING
        # Given once, the same request is admitted and its key stored.
        once = await live.client.post(
            "/v1/saves", json=save_body(), headers={**AUTH, "idempotency-key": "first"}
        )
        assert once.status_code == 200, once.text
        assert (await stored(db_pool))["save_api_request"] == 1
        # The OpenAPI document states the batch bound (max_batch is 5 in these tests).
        document = (await live.client.get("/openapi.json")).json()
        saves = document["components"]["schemas"]["SaveBatchIn"]["properties"]["saves"]
        assert (saves["minItems"], saves["maxItems"]) == (1, 5)


def test_readback_shows_the_save_api_clients_and_limits_never_a_key(tmp_path: Path) -> None:
    path = _policy_file(tmp_path, TWO_CLIENTS)
    env = {**ENVIRON, "TEST_SAVE_KEY_CRM": CRM_KEY}  # billing's variable unset
    runner = CliRunner()
    as_json = runner.invoke(app, ["ingress", "readback", "--config", str(path), "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    assert CRM_KEY not in as_json.output
    assert json.loads(as_json.output)["save_api"] == {
        "clients": [
            {
                "name": "crm",
                "key_env": "TEST_SAVE_KEY_CRM",
                "key_present": True,
                "owners": ["demo-owner"],
                "users": None,
            },
            {
                "name": "billing",
                "key_env": "TEST_SAVE_KEY_BILLING",
                "key_present": False,
                "owners": ["billing-a", "billing-b"],
                "users": ["carol"],
            },
        ],
        "max_batch": 7,
        "body_limit": 4096,
        "deadline_ms": 2500,
        "wake_timeout_ms": 500,
    }
    human = runner.invoke(app, ["ingress", "readback", "--config", str(path)], env=env)
    assert human.exit_code == 0, human.output
    assert CRM_KEY not in human.output
    # The console folds long lines at its width (80 columns under CliRunner here).
    flat = " ".join(human.output.split())
    assert (
        "save_api: POST /v1/saves, /v1/saves/batch max_batch=7 body_limit=4096 deadline_ms=2500"
        in flat
    ), human.output
    assert "- client crm key_env=TEST_SAVE_KEY_CRM key_present=True" in flat
    assert "- client billing key_env=TEST_SAVE_KEY_BILLING key_present=False" in flat
    # S-1: whom each client may save for
    assert "saves for owners: demo-owner; users: any user" in flat
    assert "saves for owners: billing-a, billing-b; users: carol" in flat
    without = _policy_file(tmp_path, TWO_CLIENTS)
    without.write_text(yaml.safe_dump(policy_document()))
    bare = runner.invoke(app, ["ingress", "readback", "--config", str(without), "--json"], env=env)
    assert json.loads(bare.output)["save_api"] is None
