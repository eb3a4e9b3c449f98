"""CLI output for scripts (issue 13): piped values are whole, help names the environment
variables and exit codes, a record id that never existed is `source_not_found`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import asyncpg
import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from cli.stack.dev_cmd import Endpoints, _print_endpoints
from cli.stack.devconfig import DEFAULT_PATH, REPO_ROOT, load_dev_config
from cli.stack.lock import DataDirLock, StackInfo, StackRunning
from cli.stack.process import free_port
from protocol.identity import link_key
from tests.cli_process import run_cli

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
    return run_cli(args, env=env, cwd=REPO_ROOT, timeout=90)


def test_piped_tables_keep_whole_link_keys(demo_db: asyncpg.Pool, db_dsn: str) -> None:
    saved = run(db_dsn, *SAVE, "--record-id", "c-001")
    assert saved.returncode == 0, saved.stderr  # admitted; the wake-up is deferred
    key = link_key("demo-owner", "push-contact", "Contact", "c-001", "remote-contacts")
    listed = run(db_dsn, "attempts", "list")
    assert listed.returncode == 0, listed.stderr
    assert key in listed.stdout  # 68 characters, in a table of seven columns
    assert "…" not in listed.stdout


@pytest.mark.parametrize("command", [["links", "list"], ["dev"], ["revalidate", "apply"]])
def test_piped_help_keeps_the_terminal_width(command: list[str]) -> None:
    # Was 10,000 columns (the width piped tables get): ~180 KB of box drawing per help.
    result = run("postgresql://unused@127.0.0.1:1/x", *command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout and "Exit codes" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_a_list_cut_by_its_limit_says_so_on_stderr(demo_db: asyncpg.Pool, db_dsn: str) -> None:
    # Was a silent cut at 500 rows.
    for record_id in ("c-001", "c-002"):
        assert run(db_dsn, *SAVE, "--record-id", record_id).returncode == 0
    # Since issue 34 item 4: JSON Lines, and the next page's cursor and command on stderr.
    cut = run(db_dsn, "attempts", "list", "--limit", "1", "--json")
    assert cut.returncode == 0, cut.stderr
    [first] = [json.loads(line) for line in cut.stdout.splitlines()]
    more = json.loads(cut.stderr)
    assert more["next_command"].startswith("connector-push attempts list --limit 1 --after ")
    rest = run(db_dsn, "attempts", "list", "--limit", "1", "--json", "--after", more["next_cursor"])
    [second] = [json.loads(line) for line in rest.stdout.splitlines()]
    assert second["attempt_id"] != first["attempt_id"]
    assert "next_cursor" not in rest.stderr  # the last page
    links = run(db_dsn, "links", "list", "--limit", "1")
    assert links.returncode == 0 and "more rows" not in links.stderr  # none yet


def test_a_record_that_never_existed_is_source_not_found(
    demo_db: asyncpg.Pool, db_dsn: str
) -> None:
    result = run(db_dsn, *SAVE, "--record-id", "no-such-record", "--json")
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["reason"] == "source_not_found"


PUSH = ["push", "--owner-key", "demo-owner", "--action-slot", "push-contact", "--user", "alice"]


@pytest.mark.parametrize(
    ("record_ids", "code"),
    [
        pytest.param(["c-001"], 0, id="admitted"),
        pytest.param(["c-001", "c-004"], 3, id="one-rejected"),  # c-004 has no Email
        pytest.param(["c-002", "no-such-record"], 3, id="one-not-found"),
    ],
)
def test_push_exits_3_when_a_save_was_rejected_or_a_record_not_found(
    demo_db: asyncpg.Pool, db_dsn: str, record_ids: list[str], code: int
) -> None:
    # Was exit 0 whatever happened. Temporal is down: the admissions stand, wakes deferred.
    named = [arg for record_id in record_ids for arg in ("--record-id", record_id)]
    result = run(db_dsn, *PUSH, *named, "--no-wait", "--json")
    assert result.returncode == code, result.stderr
    assert json.loads(result.stdout)["admitted"] == 1  # the others stand all the same


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["retire"],
        ["links", "list"],
        ["dev", "env"],
        ["revalidate", "apply"],
        ["backfill", "plan"],
    ],
)
def test_help_lists_environment_variables_and_exit_codes(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for text in ("DATABASE_URL", "TEMPORAL_ADDRESS", "Exit codes:", "unreachable"):
        assert text in result.output
    # Commands with codes of their own (revalidate, backfill) list them once, not twice.
    assert result.output.count("Exit codes:") == 1, result.output


SECRET_DSN = "postgresql://app:s3cr%2Ft@db.internal:5432/connector_push"
MASKED_DSN = "postgresql://app:***@db.internal:5432/connector_push"


def _published_stack(tmp_path: Path) -> tuple[Path, DataDirLock]:
    """A config on `tmp_path` and a lock held as a running `dev` holds it."""
    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    doc["data_dir"] = str(tmp_path)
    config = tmp_path / "temporal-dev.yaml"
    config.write_text(yaml.safe_dump(doc))
    lock = DataDirLock(tmp_path)
    lock.acquire()
    info = StackInfo(
        pid=4242,
        database_url=SECRET_DSN,
        temporal_address="127.0.0.1:7233",
        temporal_namespace="default",
        ui_url=None,
        sandbox_url="http://127.0.0.1:8765",
        ingress_url="http://127.0.0.1:8780",
    )
    lock.publish(info)
    return config, lock


def test_the_dev_stack_never_shows_the_postgres_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, lock = _published_stack(tmp_path)
    try:
        for args in (["dev", "status"], ["dev", "status", "--json"]):
            result = CliRunner().invoke(app, [*args, "--config", str(config)])
            assert result.exit_code == 0, result.output
            assert "s3cr" not in result.output and MASKED_DSN in result.output
        with pytest.raises(StackRunning) as running:  # a second `dev` on the directory
            DataDirLock(tmp_path).acquire()
        assert "s3cr" not in str(running.value) and MASKED_DSN in str(running.value)
        # `dev env` is for `eval`: it alone prints the DSN whole.
        exported = CliRunner().invoke(app, ["dev", "env", "--config", str(config)])
        assert f"DATABASE_URL={SECRET_DSN}" in exported.output
    finally:
        lock.release()
    _print_endpoints(Endpoints(SECRET_DSN, "127.0.0.1:7233", None), load_dev_config(config))
    banner = capsys.readouterr().out
    assert "s3cr" not in banner and MASKED_DSN in banner
