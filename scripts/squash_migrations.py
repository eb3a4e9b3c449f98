"""Squash the pre-release migrations into the 1.0 baseline (MIG-1, VER-1; run once, at the
release; docs/testing-and-benchmarks.md, "The baseline schema").

    .venv/bin/python scripts/squash_migrations.py [--check-only]

1. Applies every file of db/migrations to a new database of a private Postgres.
2. Dumps its schema (`pg_dump --schema-only --no-owner`, the runner's ledger left out,
   session `SET`s stripped so the file runs inside the runner's transaction), and writes
   `0001_baseline.sql`: the roles block, the dump, the ownership block and the
   transition guards rendered from `protocol/states.py` (re-runnable, so the last word
   on them is the generated block, as `db.transition_sql` requires of the newest one).
3. Applies that file alone to a second database and compares the two: columns, indexes,
   constraints, triggers, function bodies, owners, privileges and comments must be equal,
   or nothing is written.
4. Replaces the numbered files with the baseline (`--check-only`: steps 1-3 and a report).

The migrations squashed are in git history (`git log -- db/migrations`); a database they
made is refused by the runner with the way forward (db.migrate.PreReleaseDatabase).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.stack.postgres import EmbeddedPostgres, free_port, postgres_bin_dir  # noqa: E402
from db.migrate import MIGRATIONS_DIR, apply_migrations  # noqa: E402
from db.schema_catalog import schema_items  # noqa: E402
from db.transition_sql import render_transition_sql  # noqa: E402

BASELINE = "0001_baseline.sql"


async def _schema(dsn: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        return await schema_items(conn)
    finally:
        await conn.close()


def _block(tag: str) -> str:
    """The `DO $tag$ ... $tag$;` block of the migration that holds it (S-4's roles and
    ownership: 0220 before the release, the baseline itself on a re-squash)."""
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        found = re.search(rf"DO \${tag}\$.*?\${tag}\$;\n", path.read_text(), re.S)
        if found is not None:
            return found.group(0)
    raise SystemExit(f"no migration holds a DO ${tag}$ block")


def _dump(pg: EmbeddedPostgres, database: str) -> str:
    bin_dir = postgres_bin_dir()
    result = subprocess.run(
        [
            str(bin_dir / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "--exclude-table=schema_migration",
            "--host",
            pg.host,
            "--port",
            str(pg.port),
            "--username",
            "postgres",
            database,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    kept = []
    for line in result.stdout.splitlines():
        # Session settings would outlive the file in the runner's connection; the schema
        # line is Postgres's own; the dump's header is not ours.
        if re.match(r"^(SET |SELECT pg_catalog\.set_config|\\restrict|\\unrestrict)", line):
            continue
        if line.startswith(("-- Dumped ", "-- PostgreSQL database dump")):
            continue
        kept.append(line)
    text = "\n".join(kept)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def baseline_sql(dump: str) -> str:
    header = (
        "-- The 1.0 baseline (MIG-1): the schema the pre-release migrations 0001-"
        f"{_last_version():04d} made,\n"
        "-- squashed by scripts/squash_migrations.py and compared with theirs object by\n"
        "-- object. Never edit: a change after the release is a new numbered file\n"
        "-- (db/migrate.py). S-4's roles first (cluster-wide, tolerated when present), then\n"
        "-- the schema, then every object handed to the migrator role, then the ARCH-3\n"
        "-- guards rendered from protocol/states.py (the newest generated block).\n\n"
    )
    return (
        header
        # The dump defines functions before the tables their bodies name, as pg_dump's
        # own session does: for this file's transaction only.
        + "SET LOCAL check_function_bodies = false;\n\n"
        + _block("roles")
        + "\n"
        + dump
        + "\n"
        + _block("owner")
        + "\n"
        + render_transition_sql()
    )


def _last_version() -> int:
    return max(int(p.name[:4]) for p in MIGRATIONS_DIR.glob("*.sql"))


async def _squash(pg: EmbeddedPostgres, check_only: bool) -> int:
    admin = await asyncpg.connect(pg.dsn())
    try:
        for name in ("squash_old", "squash_new"):
            await admin.execute(f"DROP DATABASE IF EXISTS {name}")
            await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    applied = await apply_migrations(pg.dsn("squash_old"))
    print(f"applied {len(applied)} migrations: {applied[0]} .. {applied[-1]}")
    text = baseline_sql(_dump(pg, "squash_old"))
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / BASELINE).write_text(text)
        await apply_migrations(pg.dsn("squash_new"), migrations_dir=Path(scratch))
    old, new = await _schema(pg.dsn("squash_old")), await _schema(pg.dsn("squash_new"))
    if old != new:
        for item in sorted(set(old) ^ set(new)):
            print(("only before: " if item in old else "only after:  ") + " ".join(item))
        print("the baseline's schema differs; nothing written", file=sys.stderr)
        return 1
    print(f"baseline: {len(text.splitlines())} lines, {len(old)} schema items equal")
    if check_only:
        return 0
    for path in MIGRATIONS_DIR.glob("*.sql"):
        path.unlink()
    (MIGRATIONS_DIR / BASELINE).write_text(text)
    print(f"wrote db/migrations/{BASELINE}; the {len(applied)} files it replaces are removed")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check-only", action="store_true", help="build and compare only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cp-squash-") as work:
        pg = EmbeddedPostgres(Path(work) / "pg", "127.0.0.1", free_port(), durable=False)
        Path(work).chmod(0o755)
        pg.start()
        try:
            return asyncio.run(_squash(pg, args.check_only))
        finally:
            pg.stop()


if __name__ == "__main__":
    raise SystemExit(main())
