"""`connector-push records load`: local records and read grants for demos and tests (PACK-3)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.database import AsJson, DatabaseUrl, bad_input, connect, echo_json, read_document
from cli.database import resolve_dsn as _dsn

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from services.record_loader import LoadSummary, RecordsDocument


def validate_records_file(path: Path) -> RecordsDocument:
    """Read and validate a records file; invalid input exits non-zero naming the field."""
    from services.record_loader import RecordsFileInvalid, parse_records_document

    try:
        return parse_records_document(read_document(path))
    except RecordsFileInvalid as exc:
        bad_input(f"{path}: {exc}")


async def _load(dsn: str, document: RecordsDocument) -> LoadSummary:
    from services.record_loader import load_records

    async with connect(dsn) as conn:
        return await load_records(conn, document)


def load_command(
    file: Annotated[
        Path, typer.Argument(help="Records and grants (YAML or JSON).", show_default=False)
    ],
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Load records (fields merged, version bumped only on change) and grants (each
    entry replaces one user's access to one object), all in one transaction."""
    import asyncio

    document = validate_records_file(file)
    summary = asyncio.run(_load(_dsn(database_url), document))
    if as_json:
        echo_json(asdict(summary))
        return
    typer.echo(
        f"records: {summary.records_written} written, {summary.records_unchanged} unchanged; "
        f"grants: {summary.grants} applied"
    )


def register(app: typer.Typer) -> None:
    records = typer.Typer(help="The local record store: load records and grants.")
    records.command("load")(load_command)
    app.add_typer(records, name="records")
