"""`connector-push migrate`: apply pending schema migrations (STO-5)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from cli.database import DatabaseUrl, connect_postgres, resolve_dsn
from cli.errors import fail


async def _migrate(dsn: str) -> list[str]:
    from db.migrate import apply_migrations

    # Reachability first, so a down or misnamed database is one line (exit 5), and a
    # failing migration is reported as itself.
    conn = await connect_postgres(dsn)
    await conn.close()
    return await apply_migrations(dsn)


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate)


def migrate(
    database_url: DatabaseUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Apply pending migrations in order; an edited applied migration is an error."""
    import asyncio

    from db.migrate import MigrationError, discover_migrations

    dsn = resolve_dsn(database_url)
    try:
        applied = asyncio.run(_migrate(dsn))
    except MigrationError as exc:
        fail(escape(f"migrate: {exc}"))
    schema_version = max((m.version for m in discover_migrations()), default=0)
    if as_json:
        typer.echo(json.dumps({"applied": applied, "schema_version": schema_version}))
    elif applied:
        typer.echo(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        typer.echo(f"schema up to date (version {schema_version})")
