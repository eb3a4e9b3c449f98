"""`connector-push migrate`: apply pending schema migrations (STO-5)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import asyncpg
import typer

from cli.errors import fail
from cli.stack.devconfig import load_dev_config
from db.migrate import MigrationError, apply_migrations, discover_migrations


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate)


def migrate(
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Postgres DSN (default: $DATABASE_URL, then the dev DSN in temporal-dev.yaml)",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Apply pending migrations in order; an edited applied migration is an error."""
    dsn = database_url or os.environ.get("DATABASE_URL") or load_dev_config().postgres.dsn()
    try:
        applied = asyncio.run(apply_migrations(dsn))
    except MigrationError as exc:
        fail(f"migrate: {exc}")
    except (
        OSError,
        asyncpg.InvalidCatalogNameError,
        asyncpg.InvalidAuthorizationSpecificationError,
    ) as exc:
        fail(f"migrate: cannot reach Postgres ({exc}); is `make dev` running?", code=2)
    schema_version = max((m.version for m in discover_migrations()), default=0)
    if as_json:
        typer.echo(json.dumps({"applied": applied, "schema_version": schema_version}))
    elif applied:
        typer.echo(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        typer.echo(f"schema up to date (version {schema_version})")
