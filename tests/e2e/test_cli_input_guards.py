"""Inputs an acceptance probe found slipping past the CLI's one error path (SPEC NF-2, §12):
each is refused as one `error:` line with the documented code (2 bad input, 5 a dependency
unreachable or misconfigured) and nothing done, where they used to exit 1 as an
"unexpected error" or name the wrong value. Every command runs as a real process."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from cli.database import MAX_INPUT_BYTES
from cli.stack.temporal import TemporalDevServer
from protocol.storable import MEANINGS
from tests.e2e.test_cli_errors import KEY, PACK, SAVE, WHO, assert_one_line, down_dsn, run
from tests.e2e.test_cli_packs_records import fetchval
from worker.schedules import prune_schedule_id, relay_schedule_id

NOT_UTF8 = os.fsdecode(b"c\xff")  # what Python makes of a non-UTF-8 argv byte


@pytest.mark.parametrize(
    "args",
    [
        ["links", "find", "--remote-id", NOT_UTF8],
        ["retire", KEY, "--operator", NOT_UTF8, "--reason", "r"],
    ],
)
def test_an_argument_that_is_not_utf8_is_exit_2_before_anything_runs(args: list[str]) -> None:
    # Postgres is down: the argument is refused before any connection is tried.
    position = args.index(NOT_UTF8) + 1
    assert_one_line(
        run(*args, env={"DATABASE_URL": down_dsn()}),
        2,
        f"argument {position} is not valid UTF-8",
        "byte 0xff at character 2",
    )


@pytest.mark.parametrize(
    ("command", "suffix"),
    [
        (["pack", "apply"], ".yaml"),
        (["records", "load"], ".json"),
        (["revalidate", "validate"], ".json"),
        (["ingress", "readback"], ".yaml"),
    ],
)
def test_a_file_nested_past_the_parsers_is_exit_2(
    tmp_path: Path, command: list[str], suffix: str
) -> None:
    path = tmp_path / f"deep{suffix}"
    depth = 100_000 if suffix == ".json" else 5_000
    path.write_text("[" * depth + "]" * depth, encoding="utf-8")
    args = [*command, "--config", str(path)] if command[0] == "ingress" else [*command, str(path)]
    assert_one_line(run(*args, env={"DATABASE_URL": down_dsn()}), 2, "nested too deeply")


def _demo_pack_with(line: str, replacement: str) -> str:
    text = Path(PACK).read_text(encoding="utf-8")
    assert line in text
    return text.replace(line, replacement, 1)


_RECORD = '{{"records": [{{"object": "Contact", "id": "c-9", "fields": {{{}}}}}]}}'
UNSTORABLE = {
    "records-yaml-nan": (
        "records.yaml",
        "records:\n- {object: Contact, id: c-9, fields: {score: .nan}}\n",
        "records[0].fields.score",
    ),
    "records-json-overflow": ("r.json", _RECORD.format('"score": 1e999999'), "fields.score"),
    "records-nul": ("r.json", _RECORD.format('"name": "a\\u0000b"'), "fields.name"),
    "records-surrogate": ("r.json", _RECORD.format('"name": "a\\ud800"'), "fields.name"),
    "records-surrogate-key": ("r.json", _RECORD.format('"n\\ud800": 1'), "records[0].fields["),
    # Past Python's int-from-text limit: was "unexpected error: ValueError", exit 1.
    "records-json-long-int": ("r.json", _RECORD.format(f'"n": {"9" * 5000}'), "r.json"),
    "records-yaml-long-int": ("r.yaml", f"records: [{{n: {'9' * 5000}}}]\n", "r.yaml"),
    "pack-infinity": (
        "pack.yaml",
        _demo_pack_with("backoffCoefficient: 2.0", "backoffCoefficient: .inf"),
        "profiles[0].retryPolicy.backoffCoefficient",
    ),
    "pack-nul": (
        "pack.yaml",
        _demo_pack_with("namespace: demo", 'namespace: "demo\\0"'),
        "namespace",
    ),
}


@pytest.mark.parametrize("case", UNSTORABLE)
def test_a_value_the_database_cannot_store_is_exit_2_naming_the_field(
    tmp_path: Path, case: str
) -> None:
    # Was "unexpected error" exit 1 from inside the load (NaN and infinities are not JSON;
    # Postgres text takes no NUL and no lone surrogate). Postgres is down: it is refused first.
    name, text, field = UNSTORABLE[case]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    command = ["pack", "apply"] if case.startswith("pack") else ["records", "load"]
    result = run(*command, str(path), env={"DATABASE_URL": down_dsn()})
    assert result.returncode == 2, result.stderr
    assert field in result.stderr and "Traceback" not in result.stderr
    meanings = [*MEANINGS.values(), "a number too long to read"]
    assert any(meaning in result.stderr for meaning in meanings), result.stderr


def test_a_device_is_refused_instead_of_read_forever(tmp_path: Path) -> None:
    link = tmp_path / "pack.yaml"
    link.symlink_to("/dev/zero")
    assert_one_line(run("pack", "apply", str(link)), 2, "a device, not a file")


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_fifo_or_an_oversized_file_is_refused_without_reading_it(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "pack.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # was: read until a writer came, i.e. for ever
    else:
        with path.open("wb") as sparse:
            sparse.truncate(MAX_INPUT_BYTES + 1)
    expected = "a FIFO or socket, not a file" if kind == "fifo" else "larger than"
    assert_one_line(run("pack", "apply", str(path)), 2, str(path), expected)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--config", "{tmp}/missing.yaml"], "cannot read"),
        (["--config", "{tmp}/malformed.yaml"], "not valid YAML"),
        (["--config", "{tmp}/list.yaml"], "a sandbox config is a mapping"),
        (["--config", "{tmp}/wrong.yaml"], "seed"),
        (["--rate-limit", "abc"], "--rate-limit 'abc'"),
        (["--rate-limit", "a/b"], "--rate-limit 'a/b'"),
    ],
)
def test_a_sandbox_config_or_flag_it_cannot_use_is_one_line_exit_2(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    # Was exit 1 with multi-line YAML or pydantic dumps.
    (tmp_path / "malformed.yaml").write_text("a: [\n", encoding="utf-8")
    (tmp_path / "list.yaml").write_text("- 1\n", encoding="utf-8")
    (tmp_path / "wrong.yaml").write_text("seed: many\n", encoding="utf-8")
    given = [arg.format(tmp=tmp_path) for arg in args]
    assert_one_line(run("sandbox", *given, "--port", "1"), 2, expected)


@pytest.mark.parametrize(
    ("problem", "expected"), [("directory", "cannot read"), ("binary", "not a UTF-8")]
)
def test_ingress_readback_of_an_unreadable_policy_is_exit_2(
    tmp_path: Path, problem: str, expected: str
) -> None:
    path = tmp_path / "policy.yaml"
    if problem == "directory":
        path.mkdir()
    elif problem == "binary":
        path.write_bytes(b"\xff\xfe\x00")
    assert_one_line(run("ingress", "readback", "--config", str(path)), 2, str(path), expected)


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["retire", KEY, "--operator", "", "--reason", "why"], "--operator"),
        (["reconcile", KEY, "--remote-id", "r-1", "--evidence", "", *WHO], "--evidence"),
        # Whitespace only was taken as a name (operator commands) or failed at the first
        # adoption with a ValidationError, exit 1 (backfill apply).
        (["retire", KEY, "--operator", "ops", "--reason", " \t"], "--reason"),
        (["backfill", "apply", "--owner-key", "demo-owner", "--operator", ""], "--operator"),
        (["backfill", "apply", "--owner-key", "demo-owner", "--operator", "  "], "--operator"),
        (["pack", "apply", PACK, "--operator", " "], "--operator"),
    ],
)
def test_an_empty_operator_field_is_exit_2_naming_the_option(
    command: list[str], option: str
) -> None:
    # Neither Postgres nor Temporal is up: the input is refused before either is tried.
    env = {"DATABASE_URL": down_dsn(), "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    line = assert_one_line(run(*command, env=env), 2, option)
    assert "pydantic" not in line, line


@pytest.mark.parametrize("remote_id", [" 12", "12\n", "1\x072", "12\u200b"])
def test_a_remote_id_that_is_not_canonical_is_exit_2_before_anything_is_woken(
    remote_id: str,
) -> None:
    # Was refused only by the activity, after the link's workflow had been woken.
    command = ["reconcile", KEY, "--remote-id", remote_id, "--evidence", "seen", *WHO]
    env = {"DATABASE_URL": down_dsn(), "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    assert_one_line(run(*command, env=env), 2, "--remote-id")


def test_user_text_is_printed_as_given_not_as_markup(db_dsn: str) -> None:
    for owner in ("[/]", "[bold]x"):
        line = assert_one_line(
            run("pack", "show", "--owner-key", owner, "--database-url", db_dsn), 1
        )
        assert f"no active pack for owner key {owner!r}" in line, line
    line = assert_one_line(run("attempts", "show", "[/]", "--database-url", db_dsn), 2)
    assert "no attempt '[/]'" in line, line


def test_counts_past_int64_are_usage_errors_not_database_errors() -> None:
    for args in (
        ["prune", "--older-than", "30d", "--keep-patches", "9" * 20, "--dry-run"],
        ["backfill", "plan", "--owner-key", "demo-owner", "--batch-size", "9" * 20],
    ):
        result = run(*args, env={"DATABASE_URL": down_dsn()})
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and "int64" not in result.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["audit", "--since", "999999d"], "--since"),
        (["audit", "--since", "0001-01-01T00:00:00+01:00"], "--since"),
        (["prune", "--older-than", "999999w", "--dry-run"], "--older-than"),
    ],
)
def test_an_age_or_time_past_the_calendar_is_exit_2(args: list[str], option: str) -> None:
    # Was OverflowError (audit, exit 1) or, for prune, one after connecting; Postgres is
    # down here, so the value is refused before any connection.
    assert_one_line(run(*args, env={"DATABASE_URL": down_dsn()}), 2, option)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CONNECTOR_PUSH_MAX_CACHED_WORKFLOWS", "-1"),
        ("CONNECTOR_PUSH_OTEL_EXPORTER", "bogus"),
        ("CONNECTOR_PUSH_PRUNE_OLDER_THAN", "999999d"),
    ],
)
def test_a_worker_setting_out_of_its_rule_is_exit_5_naming_the_variable(
    variable: str, value: str
) -> None:
    line = assert_one_line(run("worker", env={variable: value}), 5, variable, "fix the variable")
    assert value not in line


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["pack", "apply", PACK, "--reinstall", "--confirm-reinstall"], id="pack"),
        pytest.param(SAVE, id="save"),
    ],
)
def test_a_setting_out_of_its_rule_is_exit_5_before_anything_is_written(
    db_dsn: str, command: list[str]
) -> None:
    # Was "unexpected error: ValidationError ... input_value='verbose'", exit 1, and
    # `pack apply` said so only after its install had committed.
    env = {"DATABASE_URL": db_dsn, "CONNECTOR_PUSH_LOG_LEVEL": "verbose"}
    result = run(*command, env=env)
    line = assert_one_line(result, 5, "CONNECTOR_PUSH_LOG_LEVEL", "fix the variable")
    assert "verbose" not in result.stdout + line
    assert fetchval(db_dsn, "SELECT count(*) FROM pack_install") == 0


def test_a_worker_whose_temporal_is_down_is_exit_5() -> None:
    env = {"DATABASE_URL": down_dsn(), "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    assert_one_line(run("worker", env=env), 5, "cannot reach Temporal", "$TEMPORAL_ADDRESS")


@pytest.mark.parametrize(
    "dsn",
    [
        pytest.param(None, id="down"),
        # A DSN asyncpg cannot read (ValueError): exit 1, "unexpected error", before.
        pytest.param("garbage-s3cret", id="not-a-dsn"),
        pytest.param("postgresql://u:s3cret@127.0.0.1:notaport/x", id="bad-port"),
    ],
)
async def test_a_worker_whose_postgres_cannot_be_used_is_exit_5_and_changes_nothing(
    temporal_server: TemporalDevServer, temporal_client: Client, dsn: str | None
) -> None:
    queue = f"guard-{uuid.uuid4().hex[:8]}"
    env = {
        "DATABASE_URL": dsn or down_dsn(),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "CONNECTOR_PUSH_TASK_QUEUE": queue,
        "CONNECTOR_PUSH_PRUNE_OLDER_THAN": "30d",
    }
    line = assert_one_line(run("worker", env=env), 5, "Postgres", "$DATABASE_URL")
    assert "s3cret" not in line
    # Was: the relay and prune schedules were created before Postgres was tried.
    for schedule_id in (relay_schedule_id(queue), prune_schedule_id(queue)):
        with pytest.raises(RPCError):
            await temporal_client.get_schedule_handle(schedule_id).describe()


@pytest.mark.parametrize(
    ("settings", "variable"),
    [
        pytest.param({"TEMPORAL_ADDRESS": "127.0.0.1:1"}, "DATABASE_URL", id="no-database-url"),
        pytest.param({"DATABASE_URL": "postgresql://u@h/d"}, "TEMPORAL_ADDRESS", id="no-address"),
        pytest.param(
            {"DATABASE_URL": "postgresql://u@h/d", "TEMPORAL_ADDRESS": " "},
            "TEMPORAL_ADDRESS",
            id="blank-address",
        ),
        pytest.param(
            {"TEMPORAL_TLS_CERT": "/no/such/cert.pem", "TEMPORAL_TLS_KEY": "/etc/hostname"},
            "TEMPORAL_TLS_CERT",
            id="missing-cert",
        ),
        pytest.param({"TEMPORAL_TLS_KEY": "/etc/hostname"}, "TEMPORAL_TLS_CERT", id="key-alone"),
    ],
)
def test_a_worker_setting_it_cannot_start_with_is_exit_5_naming_it(
    settings: dict[str, str], variable: str
) -> None:
    # Was exit 1 ("DATABASE_URL is not set", "invalid target URL: empty host",
    # "unexpected error: FileNotFoundError"). Nothing answers at 127.0.0.1:1: the settings
    # are refused before any connection is tried.
    env = {"DATABASE_URL": "postgresql://u@127.0.0.1:1/d", "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    env.update(settings)
    env = {k: v for k, v in env.items() if k in settings or k not in {variable}}
    line = assert_one_line(run("worker", env=env), 5, variable, "fix the variable")
    assert "/no/such" not in line


@pytest.mark.parametrize("where", ["missing-dir/rev.json", "."])
def test_revalidate_plan_refuses_an_out_path_it_cannot_write_before_planning(
    tmp_path: Path, where: str
) -> None:
    # Was FileNotFoundError/IsADirectoryError, exit 1, once the plan was made. Postgres is
    # down: the path is refused before any connection.
    plan = ["revalidate", "plan", "--operation-id", "op-1", "--all-finalized"]
    plan += ["--approved-by", "a", "--approval-reference", "r", "--reason", "why"]
    plan += ["--new-pack-install", "00000000-0000-0000-0000-000000000000"]
    out = str(tmp_path / where)
    line = assert_one_line(run(*plan, "--out", out, env={"DATABASE_URL": down_dsn()}), 2, "--out")
    assert out in line


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--ingress-url", "http://127.0.0.1:99999"], "--ingress-url"),
        (["--ingress-url", "http://[::1"], "--ingress-url"),
        (["--ingress-url", "127.0.0.1:8780"], "--ingress-url"),
        (["--watch", "--json"], "--watch"),
    ],
)
def test_status_refuses_an_unusable_ingress_url_or_watch_with_json(
    args: list[str], option: str
) -> None:
    # Was InvalidURL or an ExceptionGroup, exit 1, after the snapshot (and --json silently
    # dropped --watch). Postgres is down: the arguments are refused before it is tried.
    assert_one_line(run("status", *args, env={"DATABASE_URL": down_dsn()}), 2, option)


def test_a_status_filter_outside_the_lifecycle_is_exit_2_not_an_empty_list() -> None:
    for command in (["links", "list"], ["attempts", "list"]):
        result = run(*command, "--status", "bogus", env={"DATABASE_URL": down_dsn()})
        assert result.returncode == 2, result.stderr
        assert "'bogus' is not one of" in " ".join(result.stderr.split()), result.stderr


# The demo policy's secrets, so the ingress gets as far as its database settings.
INGRESS_SECRETS = {
    "DEMO_WEBHOOK_SECRET": "w",
    "DEMO_ACTION_SECRET": "a",
    "DEMO_SAVE_API_KEY": "k",
    "CONNECTOR_PUSH_INGRESS_PORT": "1",  # never bound: each case exits before serving
}
INGRESS = ["ingress", "--config", str(Path("examples") / "ingress.yaml")]


def test_an_ingress_without_database_url_is_exit_5_naming_it() -> None:
    # Was "unexpected error: ValidationError ... Field required", exit 1.
    assert_one_line(run(*INGRESS, env=INGRESS_SECRETS), 5, "DATABASE_URL", "fix the variable")


@pytest.mark.parametrize(
    "dsn",
    [
        pytest.param("garbage-s3cret", id="not-a-dsn"),
        pytest.param("postgresql://u:s3cret@127.0.0.1:notaport/x", id="bad-port"),
        pytest.param("postgresql://u:s3cret@127.0.0.1:99999/x", id="port-out-of-range"),
    ],
)
def test_an_ingress_whose_database_url_cannot_be_read_refuses_to_start(dsn: str) -> None:
    # Was: the ingress came up and answered 503 for ever (its pool connects lazily).
    env = {**INGRESS_SECRETS, "DATABASE_URL": dsn}
    line = assert_one_line(run(*INGRESS, env=env), 5, "DATABASE_URL is not a DSN")
    assert "s3cret" not in line
