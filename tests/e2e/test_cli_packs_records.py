"""`connector-push pack …` and `records load` through the real CLI against a real database."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from typer.testing import CliRunner, Result

from cli.main import app
from cli.stack.demo_data import load_demo
from cli.stack.devconfig import load_dev_config
from cli.stack.process import free_port
from services.record_store import PostgresRecordStore
from tests.unit.factories import demo_document
from tests.unit.test_manifest import INVALID

Doc = dict[str, Any]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_RECORDS = EXAMPLES / "demo-records.yaml"


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def write(path: Path, document: object) -> Path:
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def fetchval(dsn: str, sql: str) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(sql)
        finally:
            await conn.close()

    return asyncio.run(go())


def apply_json(dsn: str, file: Path) -> dict[str, Any]:
    result = run("pack", "apply", str(file), "--database-url", dsn, "--json")
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def pack_rows(dsn: str) -> tuple[int, int, str | None]:
    installs = fetchval(dsn, "SELECT count(*) FROM pack_install")
    lineage = fetchval(dsn, "SELECT count(*) FROM pack_slot_lineage")
    active = fetchval(dsn, "SELECT pack_install_id::text FROM pack_install WHERE active")
    return installs, lineage, active


@pytest.mark.parametrize(
    ("mutate", "field"),
    [pytest.param(m, f, id=name) for name, m, f, _ in INVALID],
)
def test_invalid_manifest_is_rejected_naming_the_field_and_nothing_is_written(
    db_dsn: str, tmp_path: Path, mutate: Callable[[Doc], None], field: str
) -> None:
    valid = apply_json(db_dsn, write(tmp_path / "valid.yaml", demo_document()))
    before = pack_rows(db_dsn)
    broken = copy.deepcopy(demo_document())
    mutate(broken)

    result = run(
        "pack", "apply", str(write(tmp_path / "bad.yaml", broken)), "--database-url", db_dsn
    )

    assert result.exit_code == 2, result.output
    assert field in result.stderr
    assert result.stdout == ""
    assert pack_rows(db_dsn) == before == (1, 1, valid["pack_install_id"])


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("connectorOwnerKey: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
        ("", "mapping"),
    ],
)
def test_unparseable_manifest_file_is_rejected(
    db_dsn: str, tmp_path: Path, content: str, named: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content, encoding="utf-8")
    result = run("pack", "apply", str(bad), "--database-url", db_dsn)
    assert result.exit_code == 2
    assert named in result.stderr and "bad.yaml" in result.stderr
    assert pack_rows(db_dsn) == (0, 0, None)


def test_missing_manifest_file_is_rejected(db_dsn: str, tmp_path: Path) -> None:
    result = run("pack", "apply", str(tmp_path / "nope.yaml"), "--database-url", db_dsn)
    assert result.exit_code == 2
    assert "nope.yaml: cannot read" in result.stderr


def test_apply_twice_is_one_install(db_dsn: str, tmp_path: Path) -> None:
    file = write(tmp_path / "pack.yaml", demo_document())
    first = apply_json(db_dsn, file)
    again = run("pack", "apply", str(file), "--database-url", db_dsn)

    assert first["outcome"] == "installed"
    assert again.exit_code == 0
    assert again.stdout.startswith("unchanged:") and first["pack_install_id"] in again.stdout
    listed = json.loads(run("pack", "list", "--database-url", db_dsn, "--json").stdout)
    assert [(i["pack_install_id"], i["active"]) for i in listed] == [
        (first["pack_install_id"], True)
    ]


def test_changed_manifest_is_a_new_install_with_queryable_lineage(
    db_dsn: str, tmp_path: Path
) -> None:
    old = apply_json(db_dsn, write(tmp_path / "v1.yaml", demo_document()))
    v2 = demo_document()
    v2["lineage"].append({"kind": "retire", "fromSlot": "push-lead"})
    new = apply_json(db_dsn, write(tmp_path / "v2.yaml", v2))

    assert new["outcome"] == "installed"
    assert new["pack_install_id"] != old["pack_install_id"]
    assert new["replaced_pack_install_id"] == old["pack_install_id"]
    listed = json.loads(run("pack", "list", "--database-url", db_dsn, "--json").stdout)
    assert {i["pack_install_id"]: i["active"] for i in listed} == {
        old["pack_install_id"]: False,
        new["pack_install_id"]: True,
    }
    shown = json.loads(run("pack", "show", "--database-url", db_dsn, "--json").stdout)
    assert shown["pack_install_id"] == new["pack_install_id"]
    assert shown["manifest"]["lineage"][-1] == {
        "kind": "retire",
        "fromSlot": "push-lead",
        "toSlot": None,
    }
    assert {(r["kind"], r["from_slot"], r["to_slot"]) for r in shown["lineage"]} == {
        ("rebind", "push-contact-v0", "push-contact"),
        ("retire", "push-lead", None),
    }


def test_reinstall_needs_its_confirmation_and_starts_a_new_incarnation(
    db_dsn: str, tmp_path: Path
) -> None:
    """Issue 14 item 7: the PackInstallId row of the drift matrix, reachable by an operator."""
    file = write(tmp_path / "pack.yaml", demo_document())
    first = apply_json(db_dsn, file)
    before = pack_rows(db_dsn)
    refused = run("pack", "apply", str(file), "--reinstall", "--database-url", db_dsn)
    assert refused.exit_code == 2 and "--confirm-reinstall" in refused.stderr
    assert "drift:pack_install" in refused.stderr and pack_rows(db_dsn) == before
    alone = run("pack", "apply", str(file), "--confirm-reinstall", "--database-url", db_dsn)
    assert alone.exit_code == 2 and pack_rows(db_dsn) == before
    args = ("--reinstall", "--confirm-reinstall", "--database-url", db_dsn, "--json")
    result = run("pack", "apply", str(file), *args)
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout)
    assert again["outcome"] == "installed" and again["manifest_digest"] == first["manifest_digest"]
    assert again["replaced_pack_install_id"] == first["pack_install_id"]
    assert pack_rows(db_dsn)[2] == again["pack_install_id"] != first["pack_install_id"]
    # A new incarnation, not an upgrade: no lineage back to the old install.
    previous = fetchval(
        db_dsn,
        "SELECT previous_pack_install_id FROM pack_install WHERE active",
    )
    assert previous is None


def test_pack_show_and_list_render_tables(db_dsn: str, tmp_path: Path) -> None:
    installed = apply_json(db_dsn, write(tmp_path / "pack.yaml", demo_document()))
    shown = run("pack", "show", "--owner-key", "demo-owner", "--database-url", db_dsn)
    listed = run("pack", "list", "--database-url", db_dsn)
    assert shown.exit_code == 0 and listed.exit_code == 0
    for text in ("push-contact", "remote-companies", "sandbox-locator", "push-contact-v0"):
        assert text in shown.stdout
    assert installed["pack_install_id"] in listed.stdout


def test_pack_show_without_a_pack_fails_clearly(db_dsn: str) -> None:
    result = run("pack", "show", "--database-url", db_dsn)
    assert result.exit_code != 0
    assert "no active pack" in result.stderr


def test_unreachable_database_fails_clearly(tmp_path: Path) -> None:
    file = write(tmp_path / "pack.yaml", demo_document())
    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing"
    result = run("pack", "apply", str(file), "--database-url", dsn)
    assert result.exit_code != 0
    assert "cannot reach Postgres" in result.stderr


def test_records_load_is_idempotent_and_grants_differ_by_user(db_dsn: str) -> None:
    first = run("records", "load", str(DEMO_RECORDS), "--database-url", db_dsn, "--json")
    again = run("records", "load", str(DEMO_RECORDS), "--database-url", db_dsn)

    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["records_written"] == fetchval(db_dsn, "SELECT count(*) FROM crm_record") > 0
    assert again.exit_code == 0
    assert again.stdout.startswith("records: 0 written")

    async def permissions() -> tuple[frozenset[str], frozenset[str]]:
        conn = await asyncpg.connect(db_dsn)
        try:
            store = PostgresRecordStore(conn)
            alice = await store.read_permissions("alice", "Contact", "c-001")
            bob = await store.read_permissions("bob", "Contact", "c-001")
            return alice.readable_fields, bob.readable_fields
        finally:
            await conn.close()

    alice, bob = asyncio.run(permissions())
    assert "Phone" in alice
    assert "Phone" not in bob and "Email" in bob


def test_invalid_records_file_names_the_field_and_writes_nothing(
    db_dsn: str, tmp_path: Path
) -> None:
    document = yaml.safe_load(DEMO_RECORDS.read_text(encoding="utf-8"))
    document["grants"][1]["fields"] = ["Name", " Website"]
    result = run(
        "records", "load", str(write(tmp_path / "r.yaml", document)), "--database-url", db_dsn
    )
    assert result.exit_code == 2
    assert "grants[1].fields[1]" in result.stderr
    for table in ("crm_record", "crm_object_permission", "crm_field_permission"):
        assert fetchval(db_dsn, f"SELECT count(*) FROM {table}") == 0


async def test_load_demo_applies_pack_and_records_idempotently(db_dsn: str) -> None:
    config = load_dev_config()
    first = await load_demo(db_dsn, config)
    second = await load_demo(db_dsn, config)
    assert "installed" in first[0] and "unchanged" in second[0]
    assert "0 written" in second[1]
    conn = await asyncpg.connect(db_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pack_install") == 1
        record = await PostgresRecordStore(conn).read_record("Account", "a-001")
    finally:
        await conn.close()
    assert record is not None and record.fields["PrimaryContactId"] == "c-001"


def test_load_demo_never_replaces_a_users_pack_and_takes_urls_from_the_config(
    db_dsn: str, tmp_path: Path
) -> None:
    """Issue 13: `dev --demo` on a data directory where the user applied their own pack for
    the demo owner leaves that pack active; without one, the demo pack's baseUrls come
    from temporal-dev.yaml's sandbox settings."""
    config = load_dev_config()
    users = demo_document()
    users["lineage"].append({"kind": "retire", "fromSlot": "push-lead"})  # not the demo's
    mine = apply_json(db_dsn, write(tmp_path / "mine.yaml", users))
    [pack_line, _] = asyncio.run(load_demo(db_dsn, config))
    assert f"install {mine['pack_install_id']} is active" in pack_line
    assert "never replaces a pack" in pack_line
    assert fetchval(db_dsn, "SELECT count(*) FROM pack_install") == 1  # still the user's

    fetchval(db_dsn, "UPDATE pack_install SET active = false RETURNING 1")
    sandbox = config.sandbox.model_copy(update={"port": 18765})
    [pack_line, _] = asyncio.run(load_demo(db_dsn, config.model_copy(update={"sandbox": sandbox})))
    assert "installed" in pack_line
    manifest = fetchval(db_dsn, "SELECT manifest::text FROM pack_install WHERE active")
    assert "http://127.0.0.1:18765" in manifest and ":8765" not in manifest
