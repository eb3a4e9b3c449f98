"""STO-5: the migration runner and `connector-push migrate`."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.stack.postgres import free_port
from db.migrate import (
    MIGRATIONS_DIR,
    MigrationChecksumMismatch,
    MigrationFailed,
    MigrationMissing,
    PreReleaseDatabase,
    apply_migrations,
    discover_migrations,
)
from db.schema_catalog import schema_items
from tests.fixtures.postgres import PgServer

ALL_NAMES = [migration.name for migration in discover_migrations()]


async def _schema(dsn: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await schema_items(conn)
        ledger = await conn.fetch(
            "SELECT version, name, checksum, applied_at FROM schema_migration"
        )
    finally:
        await conn.close()
    return rows + [("ledger", str(tuple(r))) for r in ledger]


@pytest.fixture
async def empty_dsn(pg_server: PgServer) -> AsyncIterator[str]:
    name = await pg_server.create_database("cp_empty")
    try:
        yield pg_server.dsn(name)
    finally:
        await pg_server.drop_database(name)


@pytest.fixture
def migrations_copy(tmp_path: Path) -> Path:
    target = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, target)
    return target


async def test_a_fresh_database_gets_every_migration_then_nothing(
    empty_dsn: str, db_dsn: str
) -> None:
    assert await apply_migrations(empty_dsn) == ALL_NAMES
    assert ALL_NAMES[0] == "0001_core"
    before = await _schema(empty_dsn)
    assert await apply_migrations(empty_dsn) == []
    assert await _schema(empty_dsn) == before
    # The cloned template is the same schema, without the ledger timestamps.
    template = [item for item in await _schema(db_dsn) if item[0] != "ledger"]
    assert template == [item for item in before if item[0] != "ledger"]


async def test_concurrent_runners_apply_each_migration_once(empty_dsn: str) -> None:
    first, second = await asyncio.gather(apply_migrations(empty_dsn), apply_migrations(empty_dsn))
    assert sorted(first + second) == ALL_NAMES


async def test_an_edited_applied_migration_is_refused_by_name(
    db_dsn: str, migrations_copy: Path
) -> None:
    edited = migrations_copy / "0001_core.sql"
    edited.write_text(edited.read_text() + "\n-- a harmless-looking edit\n")
    before = await _schema(db_dsn)
    with pytest.raises(MigrationChecksumMismatch, match=r"0001_core\.sql was edited"):
        await apply_migrations(db_dsn, migrations_dir=migrations_copy)
    assert await _schema(db_dsn) == before


async def test_a_removed_applied_migration_is_refused(db_dsn: str, migrations_copy: Path) -> None:
    removed = sorted(migrations_copy.glob("*.sql"))[-1]
    removed.unlink()
    with pytest.raises(MigrationMissing, match=rf"{removed.name} is recorded as applied"):
        await apply_migrations(db_dsn, migrations_dir=migrations_copy)


async def test_a_new_migration_applies_once(db_dsn: str, migrations_copy: Path) -> None:
    (migrations_copy / "9999_probe.sql").write_text("CREATE TABLE probe (id int);\n")
    assert await apply_migrations(db_dsn, migrations_dir=migrations_copy) == ["9999_probe"]
    assert await apply_migrations(db_dsn, migrations_dir=migrations_copy) == []


async def test_a_failing_migration_leaves_nothing_behind(
    db_dsn: str, migrations_copy: Path
) -> None:
    (migrations_copy / "9999_broken.sql").write_text(
        "CREATE TABLE half_done (id int);\nSELECT no_such_column FROM half_done;\n"
    )
    with pytest.raises(MigrationFailed, match=r"9999_broken\.sql failed"):
        await apply_migrations(db_dsn, migrations_dir=migrations_copy)
    conn = await asyncpg.connect(db_dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('half_done')") is None
        assert await conn.fetchval("SELECT max(version) FROM schema_migration") < 9999
    finally:
        await conn.close()


async def test_a_pre_release_database_is_refused_with_the_way_forward(
    empty_dsn: str, tmp_path: Path
) -> None:
    """MIG-1: a database the squashed pre-release files made is not upgraded by guessing;
    the runner names it and writes nothing."""
    conn = await asyncpg.connect(empty_dsn)
    try:
        await conn.execute(
            "CREATE TABLE schema_migration (version integer PRIMARY KEY, name text NOT NULL,"
            " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        await conn.execute(
            "INSERT INTO schema_migration (version, name, checksum) VALUES (1, '0001_core', 'x')"
        )
    finally:
        await conn.close()
    baseline = tmp_path / "migrations"
    baseline.mkdir()
    (baseline / "0001_baseline.sql").write_text("CREATE TABLE probe (id int);\n")
    with pytest.raises(PreReleaseDatabase, match=r"pre-release build .* new, empty database"):
        await apply_migrations(empty_dsn, migrations_dir=baseline)
    conn = await asyncpg.connect(empty_dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('probe')") is None
    finally:
        await conn.close()


def test_cli_migrate_reports_json(empty_dsn: str) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["migrate", "--database-url", empty_dsn, "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["applied"] == ALL_NAMES
    again = runner.invoke(app, ["migrate", "--json"], env={"DATABASE_URL": empty_dsn})
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {"applied": [], "schema_version": int(ALL_NAMES[-1][:4])}


def test_cli_migrate_names_an_unreachable_database() -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    result = CliRunner().invoke(app, ["migrate", "--database-url", dsn])
    assert result.exit_code == 5  # issue 13: a dependency unreachable is exit 5
    assert "cannot reach Postgres" in result.stderr
