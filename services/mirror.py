"""Link finalization and the compatibility mirror (SPEC POST-2, POST-3).

The mirror is written on the local record with a compare-and-set on the frozen
expected values; it is idempotent, never authoritative, and never causes a POST.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import asyncpg
from temporalio.exceptions import ApplicationError

from db import links as q
from db import slot_guard
from db.errors import invariant_errors
from db.records import Conn
from protocol.drift import DriftSurface
from protocol.errors import ActivityErrorType, MirrorStatus
from protocol.messages import StepKind
from services.packs import REMOVED_SLOT_REASON
from services.record_store import PostgresRecordStore
from services.rows import link_values, writeback_of

# Mirror tries before the mirror is recorded as skipped (the link stays authoritative).
MIRROR_ATTEMPTS: Final = 8


async def finalize_with_mirror(
    conn: Conn,
    attempt_id: str,
    token: uuid.UUID | None,
    remote_id: str,
    response: dict[str, Any],
    expected: tuple[str, ...] = ("processing", "post_sent"),
    apply_lock: slot_guard.OwnerApplyShared | None = None,
) -> StepKind:
    """In the caller's transaction: response + remote id and writeback_pending, the mirror,
    the `finalized` link, then `finalized` when the mirror's CAS applied. ID-4 violations
    propagate (and roll the mirror back with everything else). `apply_lock`: the caller
    already holds this attempt's owner's apply lock, shared (else it is taken here).

    The mirror is written before the link is inserted so the link is born with the
    mirror's outcome: one write of the link row, not an insert and then an update of a
    wide row with ten indexes and its guard triggers (~6% of Postgres's time
    per create, measured with pg_stat_statements)."""
    attempt = await q.move_attempt(
        conn,
        attempt_id,
        list(expected),
        "writeback_pending",
        token=token,
        response=response,
        remote_id=remote_id,
    )
    if attempt is None:
        raise ApplicationError(
            "attempt moved under this claim",
            type=ActivityErrorType.TRANSITION_CONFLICT.value,
            non_retryable=True,
        )
    # C-9: no apply commits between the link's birth and its check against the active
    # install (the apply suspends only the links it finds).
    if apply_lock is None or apply_lock.attempt_id != attempt_id:
        await slot_guard.lock_owner_key_shared(conn, attempt["connector_owner_key"])
    status = await _mirror(conn, attempt, give_up=False)
    link = link_values(attempt, remote_id)
    if status is not None:
        link["mirror_status"] = status.value
    with invariant_errors():
        await q.insert_link(conn, link)
    # A create sent before its slot was removed still records the object it made, and
    # the link is born suspended, as the apply suspended the others (never finalized
    # under a slot the active pack lacks, G-4).
    await slot_guard.suspend_if_slot_gone(
        conn, link["link_key"], REMOVED_SLOT_REASON, DriftSurface.ACTION_RECREATED.value
    )
    if status is None:  # the CAS conflicted: the write_mirror activity retries the mirror
        return StepKind.WRITEBACK_PENDING
    await _mirrored(conn, attempt, status)
    return StepKind.FINALIZED


async def write_mirror_now(
    conn: Conn, attempt: asyncpg.Record, *, give_up: bool
) -> StepKind | None:
    """Mirror a `writeback_pending` attempt (its row locked by the caller); None when the
    CAS conflicted (retry later)."""
    if attempt["status"] != "writeback_pending":
        return StepKind.FINALIZED if attempt["status"] == "finalized" else StepKind.PARKED
    status = await _mirror(conn, attempt, give_up)
    if status is None:
        return None
    await q.set_link_mirror_status(conn, attempt["link_key"], status.value)
    await _mirrored(conn, attempt, status)
    return StepKind.FINALIZED


async def _mirrored(conn: Conn, attempt: asyncpg.Record, status: MirrorStatus) -> None:
    """The mirror is settled: the attempt moves writeback_pending -> finalized."""
    moved = await q.move_attempt(
        conn,
        str(attempt["attempt_id"]),
        ["writeback_pending"],
        "finalized",
        mirror_status=status.value,
    )
    assert moved is not None, "attempt row is locked by this transaction"


async def _mirror(conn: Conn, attempt: asyncpg.Record, give_up: bool) -> MirrorStatus | None:
    wb = writeback_of(attempt)
    store = PostgresRecordStore(conn)
    new = {wb.remote_id_field: attempt["remote_id"], wb.provenance_field: attempt["link_key"]}
    expected = {
        wb.remote_id_field: wb.expected_remote_id,
        wb.provenance_field: wb.expected_provenance,
    }
    # The CAS never writes a deleted or missing record, so the happy path is one statement.
    if await store.compare_and_set_mirror(wb.source_object, wb.source_record_id, expected, new):
        return MirrorStatus.WRITTEN
    record = await store.read_record(wb.source_object, wb.source_record_id)
    if record is None or record.deleted:
        return MirrorStatus.SKIPPED_SOURCE_DELETED  # keep the evidence; never recreate (POST-3)
    if all(record.fields.get(f) == v for f, v in new.items()):
        return MirrorStatus.WRITTEN  # an earlier try already wrote it
    return MirrorStatus.SKIPPED if give_up else None
