"""Create-path activities of the LinkWorkflow (SPEC POST-1..4, REC-1..4, JRN-1, PROF-1).

`dispatch_create` reads the occupying attempt and its send journal first and lets
`protocol.recovery.next_step` decide what a (re)started activity may do, so a
retried activity, a workflow reset or a zombie attempt can never send a
second create: the claim writes a fresh fencing token, and the checkpoint
(`remote_io_started_at`, with this try's journal row) is a compare-and-set on it
right before the request. Every outcome is recorded in the journal in the same
transaction as the state it leads to.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.link_answers import CreateAnswers, SentTry
from activities.link_base import QuotaExhausted, fail
from activities.rate_limit import paced
from db import journal as jq
from db import links as q
from db.records import Conn
from protocol.deferred import Waiting
from protocol.errors import ActivityErrorType as E
from protocol.messages import (
    DispatchInput,
    MirrorInput,
    StepKind,
    StepResult,
)
from protocol.outcome import (
    Ambiguous,
    LocatorAbsent,
    LocatorFound,
    interpret_locator_lookup,
    interpret_post,
)
from protocol.recovery import Decision, Step, next_step
from protocol.request import FreezeFailure, locator_lookup_path
from protocol.snapshots import CreateRequestSnapshot
from services import remote
from services.attempt_drift import drift_refusal
from services.cas import require_cas
from services.deferred import resolve_deferred
from services.evidence import attempt_recovery
from services.mirror import MIRROR_ATTEMPTS, write_mirror_now
from services.record_store import PostgresRecordStore
from services.rows import link_view, request_of


@dataclass(frozen=True)
class _Send:
    attempt_id: str
    token: uuid.UUID
    request: CreateRequestSnapshot
    journal_id: int | None  # set when the claim wrote the checkpoint and its journal row


@dataclass(frozen=True)
class _Lookup:
    attempt_id: str
    token: uuid.UUID
    request: CreateRequestSnapshot


# What the planning transaction decided. A refusal is returned, not raised, so the
# parked state it reports commits: raising inside the transaction rolled it back.
_Plan = StepResult | _Send | _Lookup | ApplicationError


log = logging.getLogger(__name__)


class LinkActivities(CreateAnswers):
    """The create path: claim, POST, finalize, mirror."""

    # -- dispatch ---------------------------------------------------------------

    @activity.defn
    async def dispatch_create(self, input: DispatchInput) -> StepResult:
        """Claim and POST the pending create, or resume whatever a crash left behind; on a
        finalized link, send its queued PATCH instead."""
        if (later := await paced(self._pool, input.link_key)) is not None:
            return later  # NF-8: the budget's next slot is out of reach; nothing was sent
        plan = await self._plan(input.link_key)
        if isinstance(plan, ApplicationError):
            raise plan  # only now: the parked state it reports has committed
        if isinstance(plan, StepResult):
            if _patch_is_next(plan):
                # What the workflow's next activity would do, done in this one: a PATCH
                # costs one billed activity, not two (issue 16, P8). Any retry of this
                # activity plans afresh from Postgres and resumes the PATCH the same way.
                return await self._dispatch_patch(input.link_key)
            return plan
        if isinstance(plan, _Lookup):
            return await self._recover_by_locator(input.link_key, plan)
        return await self._send(input.link_key, plan)

    async def _plan(self, key: str) -> _Plan:
        try:
            return await self._plan_send(key)
        except QuotaExhausted as exhausted:  # the claim rolled back: nothing was written
            return await self._quota_wait(key, exhausted.wait)

    async def _plan_send(self, key: str) -> _Plan:
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            attempt = await q.occupying_attempt(conn, key)
            if attempt is None:
                return await self._settled(conn, key)
            if attempt["dispatch_lane"] not in q.CLAIMABLE_LANES:
                view = link_view(key, await q.link_by_key(conn, key), attempt)
                return fail(E.LANE_NOT_CLAIMABLE, f"lane {attempt['dispatch_lane']!r}", view)
            request = request_of(attempt)
            decision = next_step(await attempt_recovery(conn, attempt, request.profile))
            plan = await self._resume(conn, key, attempt, request, decision)
            if isinstance(plan, _Send | _Lookup):  # a request will leave: its daily quota
                await self._spend(
                    conn, plan.request.remote_scope, plan.request.profile.credential_ref
                )
            return plan

    async def _resume(
        self,
        conn: Conn,
        key: str,
        attempt: asyncpg.Record,
        request: CreateRequestSnapshot,
        decision: Decision,
    ) -> _Plan:
        """REC-4: act on what `protocol.recovery.next_step` decided from the journal."""
        attempt_id, token = str(attempt["attempt_id"]), uuid.uuid4()
        if decision.step in (Step.SEND, Step.RESEND_REPLAY_SAFE):
            refusal = await self._drift_gate(conn, key, attempt)
            if refusal is not None:
                return refusal
        match decision.step:
            case Step.SEND:
                return await self._claim(conn, key, attempt, request, token)
            case Step.RESEND_REPLAY_SAFE:
                claimed = await jq.claim_for_send(conn, attempt_id, token, checkpoint=True)
                require_cas(claimed, "claim_for_send")
                assert claimed is not None
                return _Send(attempt_id, token, request, claimed[1])
            case Step.LOOKUP_LOCATOR:
                claimed = await jq.claim_for_send(conn, attempt_id, token, checkpoint=False)
                require_cas(claimed, "claim_for_send")
                return _Lookup(attempt_id, token, request)
            case Step.PARK_AMBIGUOUS | Step.TERMINAL:
                return await self._park_planned(conn, key, attempt_id, decision)
            case Step.RESUME_WRITEBACK:
                return StepResult(kind=StepKind.WRITEBACK_PENDING, view=await self._view(conn, key))
            case Step.NOTHING | Step.READ_BACK | Step.SUSPEND_CONFLICT:
                return StepResult(kind=StepKind.PARKED, view=await self._view(conn, key))

    async def _drift_gate(
        self, conn: Conn, key: str, attempt: asyncpg.Record
    ) -> ApplicationError | None:
        """GATE-2: a fail-closed drift finding parks the attempt before any POST: nothing
        was sent yet -> `terminal_failed`; an earlier try may have landed -> ambiguous."""
        detail = await drift_refusal(conn, attempt)
        if detail is None:
            return None
        sent_before = attempt["remote_io_started_at"] is not None
        target = "ambiguous_remote_effect" if sent_before else "terminal_failed"
        moved = await q.move_attempt(
            conn,
            str(attempt["attempt_id"]),
            ["pending", "processing", "post_sent"],
            target,
            last_error=detail,
        )
        require_cas(moved, "move_attempt")
        log.warning(
            "attempt parked %s before POST: %s",
            target,
            detail,
            extra={"link_key": key, "attempt_id": str(attempt["attempt_id"])},
        )
        return fail(E.GATE_FAILED, detail, await self._view(conn, key))

    async def _resend_gate(self, key: str, plan: _Lookup) -> ApplicationError | None:
        """C-5: the drift gate before the re-send that follows a locator lookup that found
        nothing, under the link key's lock, for the attempt this lookup claimed. Another
        claim owning the row now is left to the send's fence (it sends nothing)."""
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            attempt = await q.occupying_attempt(conn, key)
            if attempt is None or attempt["claim_token"] != plan.token:
                return None
            refusal = await self._drift_gate(conn, key, attempt)
            if refusal is None:  # the re-send is a second request: its own daily quota
                await self._spend(
                    conn, plan.request.remote_scope, plan.request.profile.credential_ref
                )
            return refusal

    async def _claim(
        self,
        conn: Conn,
        key: str,
        attempt: asyncpg.Record,
        request: CreateRequestSnapshot,
        token: uuid.UUID,
    ) -> StepResult | _Send | ApplicationError:
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
            return fail(
                E.SOURCE_DELETED,
                "source record deleted before the first POST",
                await self._view(conn, key),
            )
        deferred = bool(request.pending_associations)
        if deferred:
            completed = await self._complete_deferred(conn, key, attempt, request)
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
            return fail(E.TRANSITION_CONFLICT, "attempt not claimable", await self._view(conn, key))
        if deferred:
            # LANE-2: the association-complete body is frozen under this claim.
            await q.freeze_completed_request(
                conn, attempt_id, token, request.model_dump(mode="json")
            )
        return _Send(attempt_id, token, request, claimed[1])

    async def _complete_deferred(
        self, conn: Conn, key: str, attempt: asyncpg.Record, request: CreateRequestSnapshot
    ) -> CreateRequestSnapshot | StepResult | ApplicationError:
        """LANE-2: wait for the association targets, or fail closed, or complete the body."""
        completed = await resolve_deferred(conn, attempt, request)
        if isinstance(completed, Waiting):
            view = await self._view(conn, key)
            return StepResult(kind=StepKind.WAITING, view=view, detail=str(completed.waiting_on))
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
            return fail(E.GATE_FAILED, completed.detail, await self._view(conn, key))
        return completed

    async def _send(self, key: str, plan: _Send) -> StepResult:
        await self._hooks.before_checkpoint(plan.attempt_id)
        journal_id = await self._fenced(
            key,
            plan.journal_id,
            lambda conn: jq.checkpoint_attempt(conn, plan.attempt_id, plan.token),
            "claim lost before remote I/O; sent nothing",
        )
        activity.heartbeat()
        request = plan.request
        obs = await remote.send(
            self._http,
            request.method,
            request.profile,
            request.relative_path,
            request.headers,
            request.body,
        )
        obs = obs.model_copy(update={"now": datetime.now(UTC)})
        await self._hooks.after_answer(plan.attempt_id)
        outcome = interpret_post(obs, request.response_id_path, request.profile)
        return await self._apply(
            key, SentTry(plan.attempt_id, plan.token, journal_id), outcome, obs
        )

    async def _recover_by_locator(self, key: str, plan: _Lookup) -> StepResult:
        request = plan.request
        recovery = request.profile.locator_recovery
        assert recovery is not None and request.locator_value is not None
        path = locator_lookup_path(recovery, request.target_object, request.locator_value)
        obs = await remote.send(self._http, "GET", request.profile, path, {}, None)
        found = interpret_locator_lookup(obs, request.response_id_path)
        match found:
            case LocatorFound(remote_id=remote_id):
                return await self._finalize(
                    key, SentTry(plan.attempt_id, plan.token, None), remote_id, obs, ""
                )
            case LocatorAbsent():
                # No object carries our locator: every earlier try had no effect, and the
                # remote's uniqueness on the locator refuses a duplicate of a late one.
                # The re-send is a send like any other: the attempt-side drift check runs
                # first (C-5). A found object (above) finalizes whatever drifted.
                try:
                    refusal = await self._resend_gate(key, plan)
                except QuotaExhausted as exhausted:
                    return await self._quota_wait(key, exhausted.wait)
                if refusal is not None:
                    raise refusal
                resend = _Send(plan.attempt_id, plan.token, request, None)
                return await self._send(key, resend)
            case Ambiguous(reason=reason):
                raise ApplicationError(
                    f"locator lookup inconclusive: {reason}", type="LocatorRecovery"
                )

    @activity.defn
    async def write_mirror(self, input: MirrorInput) -> StepResult:
        """Retry the compatibility mirror only; never re-POST (POST-3)."""
        give_up = activity.info().attempt >= MIRROR_ATTEMPTS
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            attempt = await q.attempt_by_id(conn, input.attempt_id)
            assert attempt is not None, "attempts are never deleted"
            kind = await write_mirror_now(conn, attempt, give_up=give_up)
            view = await self._view(conn, input.link_key)
        if kind is None:
            raise ApplicationError(
                "mirror compare-and-set conflict; retrying the mirror only", type="MirrorConflict"
            )
        return StepResult(kind=kind, view=view)


def _patch_is_next(settled: StepResult) -> bool:
    """A finalized link with queued PATCHes and no deferred create to wake first (those
    the workflow wakes before it asks for the PATCH, LANE-2)."""
    return (
        settled.kind is StepKind.FINALIZED
        and bool(settled.view.pending_patches)
        and not settled.dependants
    )
