"""ING-2' (seed 004 L2): a production profile requires the ack-drop endpoint set to be
written out and empty; a missing key or a non-empty set refuses to start, naming the
setting. Dropping in production is a break-glass incident action behind an explicit flag
(`--break-glass-ack-drop`, or its variable) that every serving process logs."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from cli.stack.process import free_port
from ingress.config import BREAK_GLASS_ENV, ConfigError, parse_policy, readback
from protocol.ingress_policy import EndpointMode
from tests.ingress.support import ENVIRON, policy_document

BREAK_GLASS_LOG = b"BREAK-GLASS ack-drop in production"


def _production(**overrides: Any) -> dict[str, Any]:
    # Completions over https: production refuses an http:// callback_base_url (S-3).
    return policy_document("https://127.0.0.1:9", profile="production", **overrides)


def _write(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_ing2p_production_refuses_a_missing_or_non_empty_ack_drop_set() -> None:
    missing = _production()
    del missing["ack_drop_endpoints"]
    with pytest.raises(ConfigError, match=r"ack_drop_endpoints: \[\] \(the key is missing\)"):
        parse_policy(yaml.safe_dump(missing))
    with pytest.raises(ConfigError, match="ack_drop_endpoints to be empty") as raised:
        parse_policy(yaml.safe_dump(_production(ack_drop_endpoints=["crm-drop"])))
    assert "--break-glass-ack-drop" in str(raised.value)
    assert "\n" not in str(raised.value)
    # Development keeps the opt-in; production with the empty set retries everywhere.
    assert parse_policy(yaml.safe_dump(policy_document())).mode_of("crm-drop") is (
        EndpointMode.ACK_DROP
    )
    empty = parse_policy(yaml.safe_dump(_production(ack_drop_endpoints=[])))
    assert {empty.mode_of(e.name) for e in empty.endpoints} == {EndpointMode.RETRY}
    assert empty.break_glass_ack_drop == frozenset()


def test_ing2p_break_glass_loads_the_set_and_readback_says_so(tmp_path: Path) -> None:
    document = _production(ack_drop_endpoints=["crm-drop"])
    policy = parse_policy(yaml.safe_dump(document), break_glass_ack_drop=True)
    assert policy.mode_of("crm-drop") is EndpointMode.ACK_DROP
    assert readback(policy, ENVIRON)["break_glass_ack_drop"] == ["crm-drop"]
    assert (
        readback(parse_policy(yaml.safe_dump(policy_document())), {})["break_glass_ack_drop"] == []
    )

    path = _write(tmp_path, document)
    runner = CliRunner()
    refused = runner.invoke(app, ["ingress", "readback", "--config", str(path)], env=ENVIRON)
    assert refused.exit_code == 2
    assert "ack_drop_endpoints to be empty" in refused.output
    by_flag = runner.invoke(
        app, ["ingress", "--break-glass-ack-drop", "readback", "--config", str(path), "--json"]
    )
    assert by_flag.exit_code == 0, by_flag.output
    assert json.loads(by_flag.output)["break_glass_ack_drop"] == ["crm-drop"]
    by_env = runner.invoke(
        app, ["ingress", "readback", "--config", str(path)], env={BREAK_GLASS_ENV: "1"}
    )
    assert by_env.exit_code == 0, by_env.output
    assert "BREAK-GLASS ack-drop in production: ['crm-drop']" in by_env.output


def _environment(db_dsn: str) -> dict[str, str]:
    return {
        **os.environ,
        **ENVIRON,
        "DATABASE_URL": db_dsn,
        "CONNECTOR_PUSH_INGRESS_PORT": str(free_port()),
        "CONNECTOR_PUSH_INGRESS_PROCESSES": "2",
    }


def _lines_until(process: subprocess.Popen[bytes], wanted: int, timeout_s: float) -> bytes:
    """stderr as it comes, until `wanted` break-glass warnings or the process ends."""
    assert process.stderr is not None
    seen = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(process.stderr, selectors.EVENT_READ)
        while seen.count(BREAK_GLASS_LOG) < wanted and time.monotonic() < deadline:
            if not selector.select(deadline - time.monotonic()):
                break
            chunk = os.read(process.stderr.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
    return seen


def test_ing2p_the_ingress_refuses_to_start_unless_break_glass_which_every_process_logs(
    tmp_path: Path, db_dsn: str
) -> None:
    path = _write(tmp_path, _production(ack_drop_endpoints=["crm-drop"]))
    command = [sys.executable, "-m", "cli", "ingress", "--config", str(path)]
    refused = subprocess.run(
        command, env=_environment(db_dsn), capture_output=True, timeout=60, check=False
    )
    output = refused.stdout + refused.stderr
    assert refused.returncode == 2, output
    assert b"ack_drop_endpoints to be empty" in output and b"Traceback" not in output

    # Two processes share the port: the one started by the flag, and the one it starts,
    # which must load the same policy (and say so) rather than refuse it.
    process = subprocess.Popen(
        [*command, "--break-glass-ack-drop"],
        env=_environment(db_dsn),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        seen = _lines_until(process, wanted=2, timeout_s=60)
    finally:
        process.terminate()
        process.wait(30)
        assert process.stderr is not None
        process.stderr.close()
    assert seen.count(BREAK_GLASS_LOG) == 2, seen.decode(errors="replace")
    assert b"crm-drop answer 204 and drop the event" in seen
