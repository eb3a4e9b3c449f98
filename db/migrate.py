"""Forward-only migration runner (STO-5): numbered plain-SQL files, checksummed.

Files are `db/migrations/NNNN_name.sql`, applied in version order, each in its
own transaction under one transaction-scoped advisory lock, and recorded in
`schema_migration`. A recorded file that was edited or removed is an error:
applied migrations are history, so a fix ships as a new file.

The rule after the release (MIG-1, VER-1's twin for the schema): `0001_baseline.sql` is
the 1.0 schema, squashed from the pre-release files by scripts/squash_migrations.py and
never edited; every change after it is a new file numbered above the newest, forward
only, re-runnable where it renders the ARCH-3 guards (`python -m db.transition_sql
--new NNNN_name`). A database the pre-release files made (its ledger starts with
`0001_core`) is refused with the way forward: such databases were never a release.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncpg

MIGRATIONS_DIR: Final = Path(__file__).parent / "migrations"
# int.from_bytes(b"connpush", "big"): fixed so every runner of every version agrees.
ADVISORY_LOCK_KEY: Final = 7165066952781951848
_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<label>[a-z0-9_]+)\.sql$")

_CREATE_LEDGER: Final = """
CREATE TABLE IF NOT EXISTS schema_migration (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_LOCK: Final = "SELECT pg_advisory_xact_lock($1)"
_RECORDED: Final = "SELECT version, name, checksum FROM schema_migration ORDER BY version"
_RECORD: Final = "INSERT INTO schema_migration (version, name, checksum) VALUES ($1, $2, $3)"


class MigrationError(Exception):
    """The migrations on disk and the ones recorded in the database disagree."""


class MigrationChecksumMismatch(MigrationError):
    """An applied migration file was edited afterwards."""


class MigrationMissing(MigrationError):
    """A migration recorded as applied has no file any more."""


class PreReleaseDatabase(MigrationError):
    """The database was migrated by a pre-release build, before the 1.0 baseline."""


class MigrationFailed(MigrationError):
    """Postgres rejected a migration's SQL; nothing of that file was applied."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str  # file name without `.sql`, e.g. "0001_core"
    sql: str
    checksum: str  # sha256 hex of the file's bytes


@dataclass(frozen=True)
class _Recorded:
    version: int
    name: str
    checksum: str


def discover_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every `NNNN_name.sql` in `directory`, by version; other `.sql` names are errors."""
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path}: migration files are named NNNN_lower_snake.sql")
        version = int(match["version"])
        if version in found:
            raise MigrationError(f"{path}: version {version} is also {found[version].name}.sql")
        data = path.read_bytes()
        found[version] = Migration(
            version, path.stem, data.decode("utf-8"), hashlib.sha256(data).hexdigest()
        )
    return [found[version] for version in sorted(found)]


async def apply_migrations(
    target: asyncpg.Connection | str, *, migrations_dir: Path | None = None
) -> list[str]:
    """Apply pending migrations; return the names applied (empty when up to date).

    `target` is a DSN or a connection outside any transaction (we open our own).
    Raises `MigrationError` before applying anything if history was edited.
    """
    migrations = discover_migrations(migrations_dir or MIGRATIONS_DIR)
    if isinstance(target, str):
        conn = await asyncpg.connect(target)
        try:
            return await _apply_all(conn, migrations)
        finally:
            await conn.close()
    return await _apply_all(target, migrations)


async def _apply_all(conn: asyncpg.Connection, migrations: list[Migration]) -> list[str]:
    async with conn.transaction():
        await conn.execute(_LOCK, ADVISORY_LOCK_KEY)
        await conn.execute(_CREATE_LEDGER)
        recorded = await _recorded(conn)
    _verify(recorded, migrations)
    applied = []
    for migration in migrations:
        if migration.version not in recorded and await _apply_one(conn, migration):
            applied.append(migration.name)
    return applied


async def _apply_one(conn: asyncpg.Connection, migration: Migration) -> bool:
    """Apply one file in its own transaction; False if a concurrent runner beat us."""
    async with conn.transaction():
        await conn.execute(_LOCK, ADVISORY_LOCK_KEY)
        recorded = await _recorded(conn)
        if migration.version in recorded:
            _verify_one(recorded[migration.version], migration)
            return False
        try:
            await conn.execute(migration.sql)
        except asyncpg.PostgresError as exc:
            raise MigrationFailed(f"migration {migration.name}.sql failed: {exc}") from exc
        await conn.execute(_RECORD, migration.version, migration.name, migration.checksum)
    return True


async def _recorded(conn: asyncpg.Connection) -> dict[int, _Recorded]:
    rows = await conn.fetch(_RECORDED)
    return {row["version"]: _Recorded(row["version"], row["name"], row["checksum"]) for row in rows}


PRE_RELEASE_FIRST: Final = "0001_core"  # the first file of the squashed history


def _verify(recorded: dict[int, _Recorded], migrations: list[Migration]) -> None:
    on_disk = {migration.version: migration for migration in migrations}
    first, baseline = recorded.get(1), on_disk.get(1)
    if (
        first is not None
        and baseline is not None
        and first.name == PRE_RELEASE_FIRST
        and baseline.name != PRE_RELEASE_FIRST
    ):
        raise PreReleaseDatabase(
            f"this database was migrated by a pre-release build ({len(recorded)} "
            f"migrations from {PRE_RELEASE_FIRST}.sql); 1.0 starts from the baseline "
            f"{baseline.name}.sql and does not upgrade pre-release databases: "
            "migrate a new, empty database and load the records again"
        )
    for version, entry in sorted(recorded.items()):
        if version not in on_disk:
            raise MigrationMissing(
                f"migration {entry.name}.sql is recorded as applied but its file is gone; "
                "restore it (applied migrations are never removed)"
            )
        _verify_one(entry, on_disk[version])


def _verify_one(entry: _Recorded, migration: Migration) -> None:
    if entry.name != migration.name:
        raise MigrationError(
            f"migration version {entry.version} was applied as {entry.name}.sql "
            f"but the file is now {migration.name}.sql; rename it back"
        )
    if entry.checksum != migration.checksum:
        raise MigrationChecksumMismatch(
            f"migration {migration.name}.sql was edited after it was applied "
            f"(recorded sha256 {entry.checksum[:12]}…, file now {migration.checksum[:12]}…); "
            "revert the edit and put the change in a new migration file"
        )
