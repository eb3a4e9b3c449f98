"""`connector-push link-key`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app
from protocol.identity import link_key

ARGS = [
    "link-key",
    "--owner-key",
    "demo-owner",
    "--action-slot",
    "push-contact",
    "--source-object",
    "Contact",
    "--record-id",
    "003A",
    "--destination-slot",
    "remote-contacts",
]
KEY = link_key("demo-owner", "push-contact", "Contact", "003A", "remote-contacts")


def test_prints_the_key() -> None:
    result = CliRunner().invoke(app, ARGS)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == KEY


def test_json_output() -> None:
    result = CliRunner().invoke(app, [*ARGS, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["link_key"] == KEY and data["workflow_id"] == f"link/{KEY}"
    assert data["source_record_id"] == "003A"


def test_invalid_part_exits_2_with_one_line_error() -> None:
    args = [*ARGS]
    args[args.index("003A")] = "003A "
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: invalid SourceRecordId: must not have leading or trailing whitespace"]
