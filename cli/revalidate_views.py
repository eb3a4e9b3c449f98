"""How `revalidate` commands show a revalidation result: conflicts, receipts, one status line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from protocol.revalidation import RevalidationResult

stdout = Console(highlight=False)
stderr = Console(stderr=True)


def _short(value: str | None) -> str:
    return "-" if value is None else value[:12]


# Rows of each table a terminal is shown; `--json` carries up to protocol.revalidation
# SHOWN of each, every receipt is in the database.
TABLE_ROWS = 50


def _more(shown: int, total: int) -> str:
    return f" (first {shown} of {total:,})" if total > shown else ""


def print_result(result: RevalidationResult) -> None:
    from protocol.revalidation import RevalidationStatus

    if result.conflicts:
        conflicts = result.conflicts[:TABLE_ROWS]
        more = _more(len(conflicts), result.conflict_count)
        table = Table(title=f"conflicts (nothing written){more}", title_justify="left")
        for column in ("link key", "reason", "detail"):
            table.add_column(column, overflow="fold")
        for c in conflicts:
            table.add_row(escape(c.link_key), c.reason.value, escape(c.detail))
        stdout.print(table)
    if result.receipts:
        receipts = result.receipts[:TABLE_ROWS]
        title = (
            "receipts" if result.status != RevalidationStatus.VALIDATED else "projected receipts"
        )
        table = Table(
            title=title + _more(len(receipts), result.receipt_count), title_justify="left"
        )
        columns = ("link key", "mapping", "body", "install", "previous op", "row digest")
        for column in columns:
            table.add_column(column, no_wrap=column == "link key")
        for r in receipts:
            table.add_row(
                escape(r.link_key),
                f"{_short(r.old_mapping_fingerprint)} -> {_short(r.new_mapping_fingerprint)}",
                f"{_short(r.old_body_fingerprint)} -> {_short(r.new_body_fingerprint)}",
                f"{_short(r.old_pack_install_id)} -> {_short(r.new_pack_install_id)}",
                escape(r.previous_operation_id or "-"),
                f"{_short(r.before_row_digest)} -> {_short(r.after_row_digest)}",
            )
        stdout.print(table)
    stdout.print(_status_line(result))


def _status_line(result: RevalidationResult) -> str:
    from protocol.revalidation import RevalidationStatus

    op, n = escape(result.operation_id), result.receipt_count
    match result.status:
        case RevalidationStatus.VALIDATED:
            return f"[bold]validated[/]: {op} would move {n} link(s); nothing written"
        case RevalidationStatus.APPLIED:
            return f"[bold green]applied[/]: {op} moved {n} link(s), {n} receipt(s) written"
        case RevalidationStatus.ALREADY_APPLIED:
            return f"[bold]already applied[/]: {op} verified on {n} link(s); nothing written"
        case RevalidationStatus.REJECTED:
            k = result.conflict_count
            return f"[bold red]rejected[/]: {op}, {k} conflict(s); nothing written"
