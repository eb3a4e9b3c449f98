"""Synchronous admission of one save (SPEC WF-2, GATE-1, GATE-2): one Postgres transaction.

Loads a plain snapshot of everything the gates need under the link key's lock,
lets `protocol.gates.decide_admission` decide, and writes only what the
decision says: a `pending` attempt with its frozen request, or nothing. No
remote I/O happens here.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from activities.packs import get_active_pack
from activities.record_store import PostgresRecordStore
from activities.rows import attempt_summary, attempt_values, link_snapshot
from db import links as q
from db import packs as packs_q
from db import patches as patches_q
from db.errors import AttemptSlotOccupiedError, invariant_errors
from db.records import Conn
from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import (
    AdmissionContext,
    AdmissionDecision,
    AssociationTarget,
    CreateReserved,
    DeferredAssociationReserved,
    LineageRow,
    ObservedActiveAttempt,
    PatchQueued,
    RecordView,
    Rejected,
    SaveRequest,
)
from protocol.drift import classify, fails_closed
from protocol.errors import RejectReason, SuspendReason
from protocol.gates import association_lookups, decide_admission
from protocol.identity import InvalidIdentityPart, link_key
from protocol.states import AttemptStatus, LinkStatus


async def admit_save(
    pool: asyncpg.Pool,
    save: SaveRequest,
    *,
    idempotency_key: str,
    locator_value: str,
    now: datetime,
) -> AdmissionDecision:
    """Decide and record one save; the caller supplies the key, locator and clock."""
    try:
        key = link_key(
            save.connector_owner_key,
            save.action_slot_id,
            save.source_object,
            save.source_record_id,
            save.destination_slot_id,
        )
    except InvalidIdentityPart as error:
        return Rejected(reason=RejectReason.STABLE_IDS_UNRESOLVED, detail=str(error))
    async with pool.acquire() as conn, conn.transaction():
        await q.lock_link_key(conn, key)
        return await admit_locked(conn, key, save, idempotency_key, locator_value, now)


async def admit_locked(
    conn: Conn,
    key: str,
    save: SaveRequest,
    idempotency_key: str,
    locator_value: str,
    now: datetime,
) -> AdmissionDecision:
    """Admission inside a transaction that already holds the link key's lock."""
    ctx, active = await load_context(
        conn, key, save, now=now, idempotency_key=idempotency_key, locator_value=locator_value
    )
    decision = _drift_first(ctx, active, decide_admission(ctx))
    next_ordinal = 1 + max((a.attempt_ordinal for a in ctx.attempts), default=0)
    return await _record(conn, key, save, decision, next_ordinal)


def _drift_first(
    ctx: AdmissionContext, active: ActiveMetadata | None, decision: AdmissionDecision
) -> AdmissionDecision:
    """A finalized link whose slot no longer resolves cleanly is drift, not a bad save:
    refusing the save must also suspend the link (DRIFT-2), whatever gate failed first."""
    link = ctx.link
    if (
        not isinstance(decision, Rejected)
        or link is None
        or link.status is not LinkStatus.FINALIZED
    ):
        return decision
    if decision.reason is RejectReason.DRIFT_FAIL_CLOSED:
        return decision
    findings = classify(link, active)
    if not fails_closed(findings):
        return decision
    return Rejected(
        reason=RejectReason.DRIFT_FAIL_CLOSED,
        detail=f"{decision.reason.value}: {decision.detail}".rstrip(": "),
        link_key=link.link_key,
        findings=tuple(findings),
    )


async def _record(
    conn: Conn, key: str, save: SaveRequest, decision: AdmissionDecision, ordinal: int
) -> AdmissionDecision:
    if isinstance(decision, PatchQueued):
        await patches_q.queue_patch(conn, key, save.originating_user_id)
        return decision
    if isinstance(decision, Rejected) and decision.reason is RejectReason.DRIFT_FAIL_CLOSED:
        # DRIFT-2: the finalized link is suspended with its findings; nothing is sent.
        findings = [f.model_dump(mode="json") for f in decision.findings]
        await patches_q.suspend_link(conn, key, SuspendReason.DRIFT.value, findings)
        await patches_q.supersede_queued(conn, key, "link suspended: drift")
        return decision
    if not isinstance(decision, CreateReserved | DeferredAssociationReserved):
        return decision
    try:
        with invariant_errors():
            attempt_id = await q.insert_attempt(conn, attempt_values(decision.reservation, ordinal))
    except AttemptSlotOccupiedError:  # unreachable under the key lock; the index is the backstop
        row = await q.occupying_attempt(conn, key)
        assert row is not None
        return ObservedActiveAttempt(
            link_key=key,
            attempt_id=str(row["attempt_id"]),
            status=AttemptStatus(row["status"]),
            dispatch_lane=row["dispatch_lane"],
        )
    del attempt_id
    return decision


async def load_context(
    conn: Conn,
    key: str,
    save: SaveRequest,
    *,
    now: datetime,
    idempotency_key: str = "patch-dispatch",
    locator_value: str | None = None,
) -> tuple[AdmissionContext, ActiveMetadata | None]:
    """Everything the gates read, as one plain snapshot (and the active metadata)."""
    active = await _active(conn, save)
    store = PostgresRecordStore(conn)
    record = await store.read_record(save.source_object, save.source_record_id)
    view = RecordView(
        exists=record is not None and not record.deleted,
        fields=record.fields if record is not None else {},
    )
    permissions = (
        await store.read_permissions(
            save.originating_user_id, save.source_object, save.source_record_id
        )
        if save.originating_user_id
        else None
    )
    link_row = await q.link_by_key(conn, key)
    ctx = AdmissionContext(
        save=save,
        active=active,
        link=link_snapshot(link_row) if link_row is not None else None,
        attempts=tuple(attempt_summary(r) for r in await q.attempt_statuses(conn, key)),
        lineage_rows=await _lineage_rows(conn, save, active),
        record=view,
        permissions=permissions,
        association_targets=await _association_targets(conn, active, view),
        idempotency_key=idempotency_key,
        locator_value=locator_value,
        decided_at=now,
    )
    return ctx, active


async def _active(conn: Conn, save: SaveRequest) -> ActiveMetadata | None:
    pack = await get_active_pack(conn, save.connector_owner_key)
    if pack is None:
        return None
    return resolve_active(
        pack.manifest,
        pack.pack_install_id,
        save.action_slot_id,
        save.destination_slot_id,
        install_ancestors=frozenset(pack.ancestors),
    )


async def _lineage_rows(
    conn: Conn, save: SaveRequest, active: ActiveMetadata | None
) -> tuple[LineageRow, ...]:
    """Rows for this record under any predecessor slot (ID-6): links and occupying attempts."""
    if active is None or not active.lineage_predecessors:
        return ()
    rebound = {
        row.from_slot
        for row in await packs_q.select_active_predecessors(
            conn, save.connector_owner_key, save.action_slot_id
        )
        if row.kind == "rebind"
    }
    rows = await q.lineage_rows(
        conn,
        save.connector_owner_key,
        list(active.lineage_predecessors),
        save.source_object,
        save.source_record_id,
    )
    return tuple(
        LineageRow(
            slot_id=r["slot_id"],
            link_status=LinkStatus(r["link_status"]) if r["link_status"] else None,
            attempt_status=AttemptStatus(r["attempt_status"]) if r["attempt_status"] else None,
            rebound=r["slot_id"] in rebound,
        )
        for r in rows
    )


async def _association_targets(
    conn: Conn, active: ActiveMetadata | None, record: RecordView
) -> dict[str, AssociationTarget]:
    if active is None or not active.usable:
        return {}
    lookups = association_lookups(active, record)
    if not lookups:
        return {}
    rows = await q.link_targets(conn, list(lookups.values()))
    return {
        contract_id: AssociationTarget(
            link_status=LinkStatus(rows[key]["status"]), remote_id=rows[key]["remote_id"]
        )
        if key in rows
        else AssociationTarget()
        for contract_id, key in lookups.items()
    }
