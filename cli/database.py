"""What database commands share: the `--database-url` option, one connection, input files."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Final, NoReturn

import asyncpg
import typer
import yaml
from rich.markup import escape

from cli.errors import fail
from cli.stack.devconfig import load_dev_config

EXIT_BAD_INPUT: Final = 2

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Postgres DSN (default: $DATABASE_URL, then the dev DSN in temporal-dev.yaml)",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def resolve_dsn(database_url: str | None) -> str:
    return database_url or os.environ.get("DATABASE_URL") or load_dev_config().postgres.dsn()


def bad_input(message: str) -> NoReturn:
    """Report invalid input (nothing was written) and exit with `EXIT_BAD_INPUT`."""
    fail(escape(message), code=EXIT_BAD_INPUT)


@asynccontextmanager
async def connect(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection; unreachable or unmigrated databases become one clear error."""
    try:
        conn = await asyncpg.connect(dsn)
    except (
        OSError,
        asyncpg.InvalidCatalogNameError,
        asyncpg.InvalidAuthorizationSpecificationError,
    ) as exc:
        fail(escape(f"cannot reach Postgres ({exc}); is `make dev` running?"))
    try:
        yield conn
    except asyncpg.UndefinedTableError as exc:
        fail(escape(f"{exc}: run `connector-push migrate` first"))
    finally:
        await conn.close()


def _syntax_error(path: Path, exc: json.JSONDecodeError | yaml.YAMLError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {exc.problem}"
    return f"{path}: not valid YAML: {exc}"


def read_document(path: Path) -> object:
    """Parse a YAML or JSON file (`.json` as JSON, anything else as YAML)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        bad_input(f"{path}: cannot read ({exc.strerror})")
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        bad_input(_syntax_error(path, exc))


def echo_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))
