"""Erase one record's values (SPEC S-7): `connector-push forget`.

A record's field values are frozen into the requests sent for it (attempt and PATCH
bodies, a create's locator value), arrive in webhook and workflow-action payloads
about its remote object, and are named by stored save answers. `forget` erases them
in one transaction, with its audit entry (OPS-2): bodies and payloads become the
marker, their hashes stay (`body_hash`, `body_fingerprint`, `erased_payload_sha256`),
and so does the evidence that a request was sent (the rows, their statuses and the
send journal, which never held values). Stored save answers naming the record go.

While any of the record's rows may still be sent or processed (an attempt or PATCH
not settled, an event not processed, a workflow action not finished) nothing is
erased: the frozen request is what a re-send must send (REC-4). The triggers of
migration 0225 refuse such a row whatever asks; this refusal names them first.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from db import audit as audit_q
from db import forget as q
from db.records import Conn
from protocol.audit import AuditCommand, AuditEntry

MAX_ID_LENGTH = 1024  # longer than any CRM object name or record id


class ForgetInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    source_object: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    record_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    operator: str = Field(min_length=1)
    reason: str = ""


class ForgetCounts(BaseModel):
    """Rows whose values this run erased (rows erased before are not counted again)."""

    model_config = ConfigDict(frozen=True)

    attempts: int = 0
    patches: int = 0
    events: int = 0
    action_executions: int = 0
    ingress_receipts: int = 0
    save_answers: int = 0  # deleted, not redacted


class ForgetReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    source_object: str
    record_id: str
    counts: ForgetCounts
    audit_id: int


class ForgetRefused(Exception):
    """Some of the record's rows may still be sent or processed; nothing was erased."""

    def __init__(self, rows: list[q.UnfinishedRow]) -> None:
        shown = ", ".join(f"{r.kind} {r.id} ({r.status})" for r in rows[:10])
        more = f" and {len(rows) - 10} more" if len(rows) > 10 else ""
        super().__init__(
            f"not erased: {len(rows)} row(s) of this record may still be sent or processed: "
            f"{shown}{more}; settle them first (links show, reconcile, supersede), then re-run"
        )
        self.rows = rows


async def forget(conn: Conn, request: ForgetInput) -> ForgetReport:
    """Erase the record's values and append the audit entry, in one transaction."""
    async with conn.transaction():
        blocking = await q.unfinished(conn, request.source_object, request.record_id)
        if blocking:
            raise ForgetRefused(blocking)
        counts = ForgetCounts.model_validate(
            {
                kind: await q.erase(conn, kind, request.source_object, request.record_id)
                for kind in q.ERASES
            }
        )
        audit_id = await audit_q.append(conn, _entry(request, counts))
    return ForgetReport(
        source_object=request.source_object,
        record_id=request.record_id,
        counts=counts,
        audit_id=audit_id,
    )


def _entry(request: ForgetInput, counts: ForgetCounts) -> AuditEntry:
    erased = counts.model_dump()
    return AuditEntry(
        operator=request.operator,
        reason=request.reason,
        command=AuditCommand.FORGET,
        arguments={"source_object": request.source_object, "record_id": request.record_id},
        state_after={"erased": dict(erased)},
        outcome=f"erased the values of {sum(erased.values())} row(s): "
        + ", ".join(f"{kind} {n}" for kind, n in erased.items()),
    )
