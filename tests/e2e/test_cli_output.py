"""CLI output for scripts (issue 13): piped values are whole, help names the environment
variables and exit codes, a record id that never existed is `source_not_found`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import asyncpg
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.stack.devconfig import REPO_ROOT
from cli.stack.process import free_port
from protocol.identity import link_key

SAVE = [
    "save",
    *("--owner-key", "demo-owner", "--action-slot", "push-contact"),
    *("--destination-slot", "remote-contacts", "--source-object", "Contact"),
    "--user",
    "alice",
]


def run(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    # stdout is a pipe here, as in `connector-push … | grep`; no COLUMNS from the shell.
    env = {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "TEMPORAL_ADDRESS"}}
    env.update(DATABASE_URL=dsn, TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}")
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=90,
        check=False,
    )


def test_piped_tables_keep_whole_link_keys(demo_db: asyncpg.Pool, db_dsn: str) -> None:
    saved = run(db_dsn, *SAVE, "--record-id", "c-001")
    assert saved.returncode == 0, saved.stderr  # admitted; the wake-up is deferred
    key = link_key("demo-owner", "push-contact", "Contact", "c-001", "remote-contacts")
    listed = run(db_dsn, "attempts", "list")
    assert listed.returncode == 0, listed.stderr
    assert key in listed.stdout  # 68 characters, in a table of seven columns
    assert "…" not in listed.stdout


def test_a_record_that_never_existed_is_source_not_found(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    result = run(db_dsn, *SAVE, "--record-id", "no-such-record", "--json")
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["reason"] == "source_not_found"


@pytest.mark.parametrize(
    "command", [[], ["retire"], ["links", "list"], ["dev", "env"], ["revalidate", "apply"]]
)
def test_help_lists_environment_variables_and_exit_codes(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for text in ("DATABASE_URL", "TEMPORAL_ADDRESS", "Exit codes:", "5 Postgres or Temporal"):
        assert text in result.output
