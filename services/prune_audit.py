"""Every prune leaves an operator audit entry (SPEC G-8, OPS-2): who ran it and why, the
cut-off and limits, the rows of each kind held before and after, and what it deleted.

A prune is many short transactions (services.retention), so its entry is appended once
the run ends, as the run's last write; a run that fails part-way still appends one,
naming the error (the counts say what it had deleted). A dry run deletes nothing and
appends nothing, like every other command's dry run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import JsonValue

from db import audit as audit_q
from db.records import Conn
from db.retained_rows import retained_rows
from protocol.audit import AuditCommand, AuditEntry
from protocol.retention import PruneCounts, PruneInput, PruneReport
from services.retention import prune


async def audited_prune(
    conn: Conn, request: PruneInput, now: datetime, operator: str, reason: str
) -> PruneReport:
    """`prune` (OPS-3), then its audit entry; `operator` and `reason` are who and why."""
    if request.dry_run:
        return await prune(conn, request, now)
    arguments: dict[str, JsonValue] = {
        "older_than_seconds": request.older_than_seconds,
        "cut_off": (now - timedelta(seconds=request.older_than_seconds)).isoformat(),
        "keep_patches_per_link": request.keep_patches_per_link,
        "batch_size": request.batch_size,
    }
    before = await retained_rows(conn)
    try:
        report = await prune(conn, request, now)
    except Exception as error:
        outcome = f"failed: {type(error).__name__}: {error}"
        try:
            await _append(conn, operator, reason, arguments, before, outcome)
        except Exception as lost:
            error.add_note(f"the prune's audit entry could not be written either: {lost!r}")
        raise
    await _append(conn, operator, reason, arguments, before, _deleted(report.counts))
    return report


async def _append(
    conn: Conn,
    operator: str,
    reason: str,
    arguments: dict[str, JsonValue],
    before: dict[str, int],
    outcome: str,
) -> None:
    entry = AuditEntry(
        operator=operator,
        reason=reason,
        command=AuditCommand.PRUNE,
        arguments=arguments,
        state_before={"rows": dict(before)},
        state_after={"rows": dict(await retained_rows(conn))},
        outcome=outcome,
    )
    await audit_q.append(conn, entry)


def _deleted(counts: PruneCounts) -> str:
    deleted = counts.model_dump()
    shown = ", ".join(f"{name} {n}" for name, n in deleted.items())
    return f"deleted {sum(deleted.values())} finished row(s): {shown}"
