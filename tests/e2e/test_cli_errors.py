"""One error path for the whole CLI (issue 13, SPEC NF-2 and §12): every infrastructure or
input error is one line on stderr naming what failed, the setting or file, and what to
do, with the documented exit code (2 bad input, 5 Postgres/Temporal unreachable or
misconfigured); `--debug` shows the traceback. Each command runs as a process of its own
(forked from tests/cli_zygote.py's server, which has the imports done), so what is asserted
is what a user's terminal shows."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from cli.stack.devconfig import DEFAULT_PATH, REPO_ROOT
from cli.stack.process import free_port, free_ports
from tests.cli_process import run_cli
from tests.fixtures.postgres import PgServer

PACK = str(REPO_ROOT / "examples" / "demo-pack.yaml")
KEY = "lk1_" + "0" * 64
SAVE = [
    "save",
    *("--owner-key", "demo-owner", "--action-slot", "push-contact"),
    *("--destination-slot", "remote-contacts", "--source-object", "Contact"),
    *("--record-id", "c-001", "--user", "alice"),
]
WHO = ["--operator", "ops", "--reason", "test"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`connector-push ARGS` as its own process (forked from tests/cli_zygote.py's server)."""
    base = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "TEMPORAL_ADDRESS"}}
    return run_cli(args, env={**base, **(env or {})}, cwd=REPO_ROOT, timeout=90)


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == code, output
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("error: "), line
    for word in words:
        assert word in line, line
    return line


def down_dsn() -> str:
    return f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/connector_push"


# One command per class: a read, a write, the migrator, the CRM entry, an operator action.
COMMANDS = {
    "read": ["links", "list"],
    "write": ["pack", "apply", PACK],
    "migrate": ["migrate"],
    "entry": SAVE,
    "operator": ["retire", KEY, *WHO],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_postgres_down_is_one_line_exit_5_naming_the_setting(command: str) -> None:
    line = assert_one_line(
        run(*COMMANDS[command], env={"DATABASE_URL": down_dsn()}),
        5,
        "cannot reach Postgres",
        "$DATABASE_URL",
        "make dev",
    )
    assert "s3cret" not in line  # the password is never printed


@pytest.mark.parametrize(
    ("dsn", "command"),
    [
        ("garbage", "read"),
        ("postgresql://postgres@127.0.0.1:notaport/x", "entry"),
        ("postgresql://u@127.0.0.1:99999/x", "write"),
    ],
)
def test_a_garbage_dsn_is_one_line_exit_5(dsn: str, command: str) -> None:
    assert_one_line(run(*COMMANDS[command], "--database-url", dsn), 5, "--database-url")


# Passwords with an unencoded '/', '?', '#' or '@' move part of themselves into the port,
# path, query or host; each piece of the password must stay out of the line all the same.
PASSWORDS = {
    "slash-after-digits": ("4242/s3cretpw", ("4242", "s3cretpw")),
    "slash": ("s3cret/4242pw", ("s3cret", "4242pw")),
    "question-mark": ("s3cret?pw4242", ("s3cret", "pw4242")),
    "hash": ("s3cret#pw4242", ("s3cret", "pw4242")),
    "at-sign": ("s3c@ret4242", ("s3c", "ret4242")),
    "plain": ("s3cret4242", ("s3cret4242",)),
}


@pytest.mark.parametrize("shape", PASSWORDS)
def test_no_piece_of_the_password_is_printed_whatever_its_shape(shape: str) -> None:
    password, pieces = PASSWORDS[shape]
    dsn = f"postgresql://u:{password}@127.0.0.1:{free_port()}/connector_push"
    for command in ("read", "entry", "migrate"):
        result = run(*COMMANDS[command], env={"DATABASE_URL": dsn})
        line = assert_one_line(result, 5, "$DATABASE_URL")
        for piece in pieces:
            assert piece not in result.stdout + result.stderr, (command, line)


def test_a_missing_database_is_one_line_exit_5(pg_server: PgServer) -> None:
    dsn = pg_server.dsn("no_such_database")
    assert_one_line(
        run("links", "list", env={"DATABASE_URL": dsn}), 5, "no_such_database", "does not exist"
    )


@pytest.fixture
async def unmigrated_dsn(pg_server: PgServer) -> AsyncIterator[str]:
    name = await pg_server.create_database("cp_unmigrated")
    try:
        yield pg_server.dsn(name)
    finally:
        await pg_server.drop_database(name)


@pytest.mark.parametrize(
    "command",
    [
        ["links", "list"],
        ["attempts", "list"],
        ["attempts", "show", "a-1"],
        SAVE,
        ["push", "--owner-key", "o", "--action-slot", "s", "--user", "a", "--all"],
        ["retire", KEY, *WHO],
        ["pack", "show"],
    ],
)
def test_an_unmigrated_database_is_one_line_exit_5_for_every_command(
    unmigrated_dsn: str, command: list[str]
) -> None:
    # Was "unexpected error: UndefinedTableError", exit 1, for all but the `connect()` users.
    env = {"DATABASE_URL": unmigrated_dsn, "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    assert_one_line(run(*command, env=env), 5, "does not exist", "connector-push migrate")


def test_debug_shows_the_traceback() -> None:
    for args, env in (
        (["--debug", "links", "list"], {"DATABASE_URL": down_dsn()}),
        (["links", "list"], {"DATABASE_URL": down_dsn(), "CONNECTOR_PUSH_DEBUG": "1"}),
    ):
        result = run(*args, env=env)
        assert result.returncode != 0 and "Traceback" in result.stderr


def _bad_files(root: Path) -> dict[str, Path]:
    (root / "binary.yaml").write_bytes(bytes(range(256)))
    (root / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (root / "a-directory.yaml").mkdir()
    return {
        "binary": root / "binary.yaml",
        "non-utf8": root / "latin1.yaml",
        "directory": root / "a-directory.yaml",
        "missing": root / "missing.yaml",
    }


@pytest.mark.parametrize(
    ("kind", "command"),
    [
        ("binary", ["pack", "apply"]),
        ("non-utf8", ["pack", "apply"]),
        ("directory", ["pack", "apply"]),
        ("missing", ["pack", "apply"]),
        ("binary", ["records", "load"]),
        ("non-utf8", ["revalidate", "validate"]),
    ],
)
def test_an_unreadable_file_is_one_line_exit_2(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    path = _bad_files(tmp_path)[kind]
    # Postgres is down too: the file is refused before any connection is tried.
    assert_one_line(run(*command, str(path), env={"DATABASE_URL": down_dsn()}), 2, str(path))


def test_dev_with_an_exported_database_that_is_down_is_one_line(tmp_path: Path) -> None:
    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    ingress, sandbox = free_ports(2)
    doc["data_dir"] = str(tmp_path)
    doc["ingress"]["port"], doc["sandbox"]["port"] = ingress, sandbox
    config = tmp_path / "temporal-dev.yaml"
    config.write_text(yaml.safe_dump(doc))
    env = {"DATABASE_URL": down_dsn(), "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    result = run("dev", "--config", str(config), env=env)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 5
    assert "using $DATABASE_URL" in result.stdout
    [line] = result.stderr.strip().splitlines()
    assert "cannot reach Postgres" in line and "unset it to run the embedded one" in line
