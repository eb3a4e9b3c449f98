"""`connector-push forget`: erase one record's values (SPEC S-7)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from cli.database import AsJson, DatabaseUrl, bad_input, connect, echo_json
from cli.database import resolve_dsn as _dsn
from cli.errors import fail

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from services.forget import ForgetInput, ForgetReport

_stdout = Console(highlight=False)

_KINDS = (
    ("attempts", "create attempts: frozen body and locator value"),
    ("patches", "PATCH rows: frozen body"),
    ("events", "webhook events: payload"),
    ("ingress_receipts", "ingress receipts: payload"),
    ("action_executions", "workflow action executions: payload"),
    ("save_answers", "stored save answers naming the record (deleted)"),
)


async def _run(dsn: str, request: ForgetInput) -> ForgetReport:
    from services.forget import forget

    async with connect(dsn) as conn:
        return await forget(conn, request)


def _print(report: ForgetReport) -> None:
    _stdout.print(
        f"{escape(report.source_object)} {escape(report.record_id)}: values erased "
        f"(audit entry {report.audit_id}); hashes and the evidence of sends are kept"
    )
    for kind, label in _KINDS:
        _stdout.print(f"  {getattr(report.counts, kind):>6}  {label}")


def forget_command(
    source_object: Annotated[
        str, typer.Option("--source-object", help="The record's CRM object (its SourceObject).")
    ],
    record_id: Annotated[str, typer.Option("--record-id", help="The record's id in the CRM.")],
    operator: Annotated[
        str, typer.Option("--operator", help="Who erases (recorded in the audit trail).")
    ] = os.environ.get("USER", "operator"),
    reason: Annotated[
        str, typer.Option("--reason", help="Why, e.g. the erasure request's reference.")
    ] = "",
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Erase a record's values from frozen request bodies, webhook and workflow-action
    payloads and stored save answers, keeping their hashes and the evidence that requests
    were sent; one audit entry. Refused (nothing erased) while any of the record's
    attempts, PATCHes, events or workflow actions is unfinished."""
    import asyncio

    from pydantic import ValidationError

    from services.forget import ForgetInput, ForgetRefused

    try:
        request = ForgetInput(
            source_object=source_object.strip(),
            record_id=record_id.strip(),
            operator=operator.strip(),
            reason=reason,
        )
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        option = {"source_object": "--source-object", "record_id": "--record-id"}.get(
            str(problem["loc"][0]), "--operator"
        )
        bad_input(f"{option}: {problem['msg']}")
    try:
        report = asyncio.run(_run(_dsn(database_url), request))
    except ForgetRefused as refused:
        fail(escape(str(refused)))
    if as_json:
        echo_json(report.model_dump(mode="json"))
    else:
        _print(report)


def register(app: typer.Typer) -> None:
    app.command("forget")(forget_command)
