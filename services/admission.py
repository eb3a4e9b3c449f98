"""Synchronous admission of saves (SPEC WF-2, GATE-1, GATE-2): one Postgres transaction.

Loads a plain snapshot of everything the gates need under the link keys' locks
(`services.admission_facts`, set-wise: a batch costs a fixed number of statements),
lets `protocol.gates.decide_admission` decide each save in order, and writes only
what the decisions say: `pending` attempts with their frozen requests, queued
PATCHes, drift suspensions, or nothing. No remote I/O happens here.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from db import link_batches as batch_q
from db import links as q
from db import patches as patches_q
from db.errors import invariant_errors
from db.records import Conn
from protocol.active import ActiveMetadata
from protocol.admission import (
    AdmissionContext,
    AdmissionDecision,
    AttemptSummary,
    CreateReserved,
    DeferredAssociationReserved,
    PatchQueued,
    Rejected,
    SaveRequest,
)
from protocol.drift import classify, fails_closed
from protocol.drift import suspend_reason as drift_suspend_reason
from protocol.errors import RejectReason
from protocol.gates import decide_admission
from protocol.identity import InvalidIdentityPart, link_key
from protocol.states import AttemptStatus, LinkStatus
from services.admission_facts import AdmissionFacts, SaveToAdmit, load_facts
from services.rows import attempt_values


def key_or_rejection(save: SaveRequest) -> str | Rejected:
    """The save's link key (ID-2), or the refusal when a stable id is no valid key part."""
    try:
        return link_key(
            save.connector_owner_key,
            save.action_slot_id,
            save.source_object,
            save.source_record_id,
            save.destination_slot_id,
        )
    except InvalidIdentityPart as error:
        return Rejected(reason=RejectReason.STABLE_IDS_UNRESOLVED, detail=str(error))


async def admit_save(
    pool: asyncpg.Pool,
    save: SaveRequest,
    *,
    idempotency_key: str,
    locator_value: str,
    now: datetime,
) -> AdmissionDecision:
    """Decide and record one save; the caller supplies the key, locator and clock."""
    key = key_or_rejection(save)
    if isinstance(key, Rejected):
        return key
    async with pool.acquire() as conn, conn.transaction():
        await batch_q.keep_generic_plans(conn)  # one save, the batch statements' plans
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
    [decision] = await admit_all_locked(
        conn, [SaveToAdmit(key, save, idempotency_key, locator_value)], now
    )
    return decision


async def admit_all_locked(
    conn: Conn, items: Sequence[SaveToAdmit], now: datetime
) -> list[AdmissionDecision]:
    """Admit saves in order inside a transaction holding every one of their link keys'
    locks, in a fixed number of statements whatever their count; each decision is the
    one admitting the saves one by one would give (a later save of a key sees what an
    earlier one reserved, queued or suspended)."""
    facts = await load_facts(conn, list(items))
    writes = _Writes()
    decisions = [_decide(facts, writes, item, now) for item in items]
    await writes.flush(conn)
    return decisions


def _decide(
    facts: AdmissionFacts, writes: _Writes, item: SaveToAdmit, now: datetime
) -> AdmissionDecision:
    """One save's decision, noted for writing and applied to the batch's facts."""
    ctx = facts.context(item, now)
    decision = _drift_first(ctx, ctx.active, decide_admission(ctx))
    if isinstance(decision, CreateReserved | DeferredAssociationReserved):
        ordinal = 1 + max((a.attempt_ordinal for a in ctx.attempts), default=0)
        attempt_id = str(uuid.uuid4())
        writes.attempts.append(
            {"attempt_id": attempt_id, **attempt_values(decision.reservation, ordinal)}
        )
        summary = AttemptSummary(
            attempt_id=attempt_id,
            status=AttemptStatus.PENDING,
            dispatch_lane=decision.reservation.dispatch_lane.value,
            attempt_ordinal=ordinal,
        )
        facts.reserved(item, summary)
    elif isinstance(decision, PatchQueued):
        # PATCH-2: one queued PATCH per link, the latest saver's.
        writes.patches.pop(item.key, None)
        writes.patches[item.key] = item.save.originating_user_id
    elif isinstance(decision, Rejected) and decision.reason is RejectReason.DRIFT_FAIL_CLOSED:
        # DRIFT-2: the finalized link is suspended with its findings; nothing is sent.
        findings = [f.model_dump(mode="json") for f in decision.findings]
        reason = drift_suspend_reason(decision.findings)
        writes.suspensions.append((item.key, reason, findings))
        facts.suspended(item.key, reason)
    return decision


@dataclass
class _Writes:
    """What a batch's decisions write, flushed in one statement per kind (suspensions,
    rare, one by one): attempts, then PATCHes, then suspensions, so a PATCH an earlier
    save queued is superseded by a later save's suspension as it would be one by one."""

    attempts: list[dict[str, Any]] = field(default_factory=list)
    patches: dict[str, str | None] = field(default_factory=dict)
    suspensions: list[tuple[str, str, list[dict[str, Any]]]] = field(default_factory=list)

    async def flush(self, conn: Conn) -> None:
        if self.attempts:
            # The ID-5 index is the backstop: under the key locks it cannot fire.
            with invariant_errors():
                await batch_q.insert_attempts(conn, self.attempts)
        if self.patches:
            await patches_q.queue_patches(conn, self.patches)
        for key, reason, findings in self.suspensions:
            # No run may be going: the save's wake-up is best effort, the relay's is not.
            await patches_q.suspend_link(conn, key, reason, findings, wake=True)
            await patches_q.supersede_queued(conn, key, "link suspended: drift")


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
    item = SaveToAdmit(key, save, idempotency_key, locator_value)
    ctx = (await load_facts(conn, [item])).context(item, now)
    return ctx, ctx.active
