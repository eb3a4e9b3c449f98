"""`connector-push audit`: the operator audit trail (SPEC OPS-2), newest first, a page at
a time by cursor (`cli.paging`, NF-7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli import paging
from cli.database import AsJson, DatabaseUrl, bad_input, connect
from cli.database import resolve_dsn as _dsn

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from protocol.audit import AuditRecord

_stdout = Console(highlight=False)
AUDIT_LIMIT: Final = 100


def _since(text: str | None) -> datetime | None:
    """An age (`24h`: since 24 hours ago) or an ISO-8601 time (UTC when no offset)."""
    from protocol.retention import AgeInvalid, AgeTooLong, parse_age

    if text is None:
        return None
    try:
        return datetime.now(UTC) - parse_age(text)
    except AgeTooLong as error:
        bad_input(f"--since: {error}")
    except AgeInvalid:
        pass
    try:
        when = datetime.fromisoformat(text)
        # In UTC it must still be a date (0001-01-01T00:00+01:00 is not).
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        bad_input(f"--since {text!r}: an age like 24h or 7d, or an ISO time like 2026-12-01T10:00")


async def _entries(
    dsn: str, link_key: str | None, since: datetime | None, limit: int, before: int | None
) -> list[AuditRecord]:
    """One page and one entry more (which says there are more)."""
    from db import audit as q

    async with connect(dsn) as conn:
        return await q.entries(conn, link_key, since, limit + 1, before)


def _short(value: object) -> str:
    """Digests and install ids to a recognisable prefix on a terminal (`--json` has them
    whole); piped output keeps every value whole (a script reads what it pipes in full)."""
    text = str(value)
    if not _stdout.is_terminal or len(text) <= 24:
        return text
    return text[:16] + "…"


def _state(value: object) -> str:
    if not isinstance(value, dict):
        return "-" if value is None else _short(value)
    shown = [f"{k}={_short(v)}" for k, v in sorted(value.items()) if v is not None]
    return "\n".join(shown) or "-"


def _print(records: list[AuditRecord]) -> None:
    if not records:
        _stdout.print("no audit entries")
        return
    table = Table(title="operator audit trail (newest first)", title_justify="left")
    for column in ("when", "operator", "command", "link key", "reason", "before", "after"):
        table.add_column(column, overflow="fold")
    for r in records:
        table.add_row(
            r.recorded_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            escape(r.operator),
            r.command.value,
            escape(r.link_key or "-"),  # whole: the key is what the next command takes
            escape(r.reason or "-"),
            escape(_state(r.state_before)),
            escape(_state(r.state_after) + f" ({r.outcome})"),
        )
    _stdout.print(table)


def audit_command(
    link_key: Annotated[
        str | None, typer.Option("--link-key", help="Only entries about this link.")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="An age (24h, 7d) or an ISO-8601 time.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10_000, help="Entries per page.")
    ] = AUDIT_LIMIT,
    after: paging.After = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Every operator action: who, when, why, the command, the state before and after;
    a page at a time, newest first (stderr names the next page)."""
    import asyncio

    before = paging.int_cursor(after, "audit")
    found = asyncio.run(_entries(_dsn(database_url), link_key, _since(since), limit, before))
    records = found[:limit]
    if as_json:
        for record in records:
            paging.json_line(record.model_dump(mode="json"))
    else:
        _print(records)
    if len(found) > limit:
        command = ["audit", *(["--link-key", link_key] if link_key else [])]
        command += [*(["--since", since] if since else [])]
        command += [*(["--limit", str(limit)] if limit != AUDIT_LIMIT else [])]
        cursor = paging.encode_cursor("audit", records[-1].audit_id)
        paging.say_more(command, cursor, as_json, database_url is not None)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit_command)
