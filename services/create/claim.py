"""Claiming a create (SPEC POST-1, REC-1, REC-4, GATE-2, C-5, LANE-2, §17 G-1): under the
link lock, act on what `protocol.recovery.next_step` decides from the attempt's journal:
claim it for a send (after the send gate, the source check and, in the deferred lane,
completing its body), claim it for a locator lookup (after the send gate, with the
lookup's journal row), resume its writeback, or park it. A claim that will send spends
the budget's daily quota in the same transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from db import journal as jq
from db import links as q
from db.records import Conn
from protocol.deferred import Waiting
from protocol.errors import ActivityErrorType as E
from protocol.messages import StepKind, StepResult
from protocol.recovery import Decision, RecoveryInput, Step, next_step
from protocol.request import FreezeFailure
from protocol.send_gate import RequestKind
from protocol.snapshots import CreateRequestSnapshot
from services.cas import require_cas
from services.create.gate import gate_create, key_age
from services.deferred import resolve_deferred
from services.evidence import attempt_recovery
from services.link_step import (
    LinkStep,
    QuotaExhausted,
    StepFailed,
    lock_link,
    quota_wait,
    settled,
    spend,
    view,
)
from services.record_store import PostgresRecordStore
from services.rows import link_view, request_of


@dataclass(frozen=True)
class CreateSend:
    """An attempt claimed for a send of its frozen request."""

    attempt_id: str
    token: uuid.UUID
    request: CreateRequestSnapshot
    journal_id: int | None  # set when the claim wrote the checkpoint and its journal row


@dataclass(frozen=True)
class LocatorLookup:
    """An attempt claimed for a look-up of its unique locator: no checkpoint, the GET's
    own journal row (kind `lookup`, G-1)."""

    attempt_id: str
    token: uuid.UUID
    request: CreateRequestSnapshot
    journal_id: int | None = None
    landed: int = 1  # the attempt's tries that may have landed (a lookup follows one)


# What the claim decided. A refusal is returned, not raised, so the parked state it
# reports commits: raising inside the transaction rolled it back.
Claim = StepResult | CreateSend | LocatorLookup | StepFailed


async def claim_create(step: LinkStep, key: str) -> Claim:
    """The claimed send or lookup, or what the link is when nothing is to be sent."""
    try:
        return await _claim(step, key)
    except QuotaExhausted as exhausted:  # the claim rolled back: nothing was written
        return await quota_wait(step, key, exhausted.wait)


async def _claim(step: LinkStep, key: str) -> Claim:
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        attempt = await q.occupying_attempt(conn, key)
        if attempt is None:
            return await settled(conn, key)
        if attempt["dispatch_lane"] not in q.CLAIMABLE_LANES:
            now = link_view(key, await q.link_by_key(conn, key), attempt)
            return StepFailed(E.LANE_NOT_CLAIMABLE, f"lane {attempt['dispatch_lane']!r}", now)
        request = request_of(attempt)
        recovery = await attempt_recovery(conn, attempt, request.profile)
        decision = next_step(recovery)
        refusal = await _gate(step, conn, key, attempt, request, recovery, decision)
        if refusal is not None:
            return refusal
        plan = await _resume(conn, key, attempt, request, decision)
        if isinstance(plan, CreateSend | LocatorLookup):  # a request will leave: its quota
            await spend(step, conn, plan.request.remote_scope, plan.request.profile.credential_ref)
        return plan


# The G-1 row of each step that sends a request.
_REQUEST_KIND = {
    Step.SEND: RequestKind.CREATE_FIRST,
    Step.RESEND_REPLAY_SAFE: RequestKind.CREATE_RESEND,
    Step.LOOKUP_LOCATOR: RequestKind.LOOKUP,
}


async def _gate(
    step: LinkStep,
    conn: Conn,
    key: str,
    attempt: asyncpg.Record,
    request: CreateRequestSnapshot,
    recovery: RecoveryInput,
    decision: Decision,
) -> StepFailed | None:
    """G-1, in this claim's transaction, for the request the journal's decision sends."""
    kind = _REQUEST_KIND.get(decision.step)
    if kind is None:
        return None
    age = (
        key_age(recovery, request, step.hooks.now()) if kind is RequestKind.CREATE_RESEND else None
    )
    return await gate_create(conn, key, attempt, kind, decision.may_have_landed, age)


async def _resume(
    conn: Conn,
    key: str,
    attempt: asyncpg.Record,
    request: CreateRequestSnapshot,
    decision: Decision,
) -> Claim:
    """REC-4: act on what `protocol.recovery.next_step` decided from the journal (the send
    gate passed for the request it sends)."""
    attempt_id, token = str(attempt["attempt_id"]), uuid.uuid4()
    match decision.step:
        case Step.SEND:
            return await _claim_send(conn, key, attempt, request, token)
        case Step.RESEND_REPLAY_SAFE:
            claimed = await jq.claim_for_send(conn, attempt_id, token, checkpoint=True)
            require_cas(claimed, "claim_for_send")
            assert claimed is not None
            return CreateSend(attempt_id, token, request, claimed[1])
        case Step.LOOKUP_LOCATOR:
            claimed = await jq.claim_for_send(
                conn, attempt_id, token, checkpoint=False, lookup=True
            )
            require_cas(claimed, "claim_for_send")
            assert claimed is not None
            return LocatorLookup(attempt_id, token, request, claimed[1], decision.may_have_landed)
        case Step.PARK_AMBIGUOUS | Step.TERMINAL:
            return await park_planned(conn, key, attempt_id, decision)
        case Step.RESUME_WRITEBACK:
            return StepResult(kind=StepKind.WRITEBACK_PENDING, view=await view(conn, key))
        case Step.NOTHING | Step.READ_BACK | Step.SUSPEND_CONFLICT:
            return StepResult(kind=StepKind.PARKED, view=await view(conn, key))


async def park_planned(conn: Conn, key: str, attempt_id: str, decision: Decision) -> StepFailed:
    """Park the attempt as the journal decided (ambiguous, or terminal when no try can
    have landed), whoever holds its claim; the refusal the step then raises."""
    ambiguous = decision.step is Step.PARK_AMBIGUOUS
    target = "ambiguous_remote_effect" if ambiguous else "terminal_failed"
    moved = await q.move_attempt(
        conn,
        attempt_id,
        ["pending", "processing", "post_sent"],
        target,
        last_error=decision.reason,
    )
    require_cas(moved, "move_attempt")
    kind = E.AMBIGUOUS_REMOTE_EFFECT if ambiguous else E.REMOTE_REJECTED
    return StepFailed(kind, decision.reason, await view(conn, key))


async def claim_resend(step: LinkStep, key: str, lookup: LocatorLookup) -> StepFailed | None:
    """C-5, G-1: the send gate before the re-send that follows a locator lookup that found
    nothing, under the link key's lock, for the attempt this lookup claimed; the re-send
    spends its own daily quota (`QuotaExhausted` rolls it back). Another claim owning the
    row now is left to the send's fence (it sends nothing)."""
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        attempt = await q.occupying_attempt(conn, key)
        if attempt is None or attempt["claim_token"] != lookup.token:
            return None
        # No key age: the remote's unique locator, not its key, refuses a duplicate.
        refusal = await gate_create(conn, key, attempt, RequestKind.CREATE_RESEND, lookup.landed)
        if refusal is None:  # the re-send is a second request: its own daily quota
            request = lookup.request
            await spend(step, conn, request.remote_scope, request.profile.credential_ref)
        return refusal


async def _claim_send(
    conn: Conn,
    key: str,
    attempt: asyncpg.Record,
    request: CreateRequestSnapshot,
    token: uuid.UUID,
) -> StepResult | CreateSend | StepFailed:
    attempt_id = str(attempt["attempt_id"])
    store = PostgresRecordStore(conn)
    if not await store.exists(attempt["source_object"], attempt["source_record_id"]):
        # POST-1 / seed rule 7: a delayed create never POSTs for a deleted source.
        require_cas(
            await q.move_attempt(
                conn,
                attempt_id,
                ["pending", "processing"],
                "terminal_failed",
                last_error="source_deleted",
            ),
            "move_attempt",
        )
        return StepFailed(
            E.SOURCE_DELETED, "source record deleted before the first POST", await view(conn, key)
        )
    deferred = bool(request.pending_associations)
    if deferred:
        completed = await _complete_deferred(conn, key, attempt, request)
        if not isinstance(completed, CreateRequestSnapshot):
            return completed
        request = completed
    # Where a late duplicate send is harmless (the remote replays the same idempotency
    # key, or the unique locator rejects a second object), the claim and the
    # RemoteIOStartedAt checkpoint (with its journal row) are one compare-and-set;
    # otherwise they are two, so a try that stalls after its claim can still be fenced
    # off before it sends (REC-1). A deferred create freezes its completed body under
    # the claim first: the frozen request never changes once a try passed its fence.
    profile = request.profile
    merged = (profile.post_replay_safe or profile.locator_recovery is not None) and not deferred
    claimed = await jq.claim_for_send(conn, attempt_id, token, checkpoint=merged)
    if claimed is None:
        return StepFailed(E.TRANSITION_CONFLICT, "attempt not claimable", await view(conn, key))
    if deferred:
        # LANE-2: the association-complete body is frozen under this claim.
        await q.freeze_completed_request(conn, attempt_id, token, request.model_dump(mode="json"))
    return CreateSend(attempt_id, token, request, claimed[1])


async def _complete_deferred(
    conn: Conn, key: str, attempt: asyncpg.Record, request: CreateRequestSnapshot
) -> CreateRequestSnapshot | StepResult | StepFailed:
    """LANE-2: wait for the association targets, or fail closed, or complete the body."""
    completed = await resolve_deferred(conn, attempt, request)
    if isinstance(completed, Waiting):
        now = await view(conn, key)
        return StepResult(kind=StepKind.WAITING, view=now, detail=str(completed.waiting_on))
    if isinstance(completed, FreezeFailure):
        require_cas(
            await q.move_attempt(
                conn,
                str(attempt["attempt_id"]),
                ["pending", "processing"],
                "terminal_failed",
                last_error=f"association: {completed.detail}",
            ),
            "move_attempt",
        )
        return StepFailed(E.GATE_FAILED, completed.detail, await view(conn, key))
    return completed
