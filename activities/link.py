"""Create-path activities of the LinkWorkflow (SPEC POST-1..4, REC-1..3).

`dispatch_create` reads the occupying attempt first and lets
`protocol.outcome.resume_post` decide what a (re)started activity may do, so a
retried activity, a workflow reset or a zombie attempt can never send a
second create: the claim writes a fresh fencing token, and the checkpoint
(`remote_io_started_at`) is a compare-and-set on it right before the request.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import remote
from activities.deferred import resolve_deferred
from activities.link_base import LinkActivityBase, fail, require_cas
from activities.mirror import MIRROR_ATTEMPTS, finalize_with_mirror, write_mirror_now
from activities.record_store import PostgresRecordStore
from activities.rows import link_view, request_of
from db import links as q
from db.errors import RemoteLocatorClaimedError
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
    Created,
    LocatorAbsent,
    LocatorFound,
    Observation,
    RateLimited,
    RemoteRejected,
    ResumeAction,
    RetrySameRequest,
    Transport,
    interpret_locator_lookup,
    interpret_post,
    resume_post,
)
from protocol.request import FreezeFailure, locator_lookup_path
from protocol.snapshots import CreateRequestSnapshot
from protocol.states import AttemptStatus


@dataclass(frozen=True)
class _Send:
    attempt_id: str
    token: uuid.UUID
    request: CreateRequestSnapshot
    checkpointed: bool  # RemoteIOStartedAt already written under this try's token
    previously_started: bool = False  # an earlier try may have sent this request


@dataclass(frozen=True)
class _Lookup:
    attempt_id: str
    token: uuid.UUID
    request: CreateRequestSnapshot


# What the planning transaction decided. A refusal is returned, not raised, so the
# parked state it reports commits: raising inside the transaction rolled it back.
_Plan = StepResult | _Send | _Lookup | ApplicationError


log = logging.getLogger(__name__)


class LinkActivities(LinkActivityBase):
    """The create path: claim, POST, finalize, mirror."""

    # -- dispatch ---------------------------------------------------------------

    @activity.defn
    async def dispatch_create(self, input: DispatchInput) -> StepResult:
        """Claim and POST the pending create, or resume whatever a crash left behind."""
        plan = await self._plan(input.link_key)
        if isinstance(plan, ApplicationError):
            raise plan  # only now: the parked state it reports has committed
        if isinstance(plan, StepResult):
            return plan
        if isinstance(plan, _Lookup):
            return await self._recover_by_locator(input.link_key, plan)
        return await self._send(input.link_key, plan)

    async def _plan(self, key: str) -> _Plan:
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            attempt = await q.occupying_attempt(conn, key)
            if attempt is None:
                return await self._settled(conn, key)
            if attempt["dispatch_lane"] not in q.CLAIMABLE_LANES:
                view = link_view(key, await q.link_by_key(conn, key), attempt)
                return fail(E.LANE_NOT_CLAIMABLE, f"lane {attempt['dispatch_lane']!r}", view)
            request = request_of(attempt)
            started = attempt["remote_io_started_at"] is not None
            action = resume_post(AttemptStatus(attempt["status"]), started, request.profile)
            return await self._resume(conn, key, attempt, request, action)

    async def _resume(
        self,
        conn: Conn,
        key: str,
        attempt: asyncpg.Record,
        request: CreateRequestSnapshot,
        action: ResumeAction,
    ) -> _Plan:
        attempt_id, token = str(attempt["attempt_id"]), uuid.uuid4()
        match action:
            case ResumeAction.CLAIM_AND_POST:
                return await self._claim(conn, key, attempt, request, token)
            case ResumeAction.RETRY_SAME_REQUEST:
                require_cas(
                    await q.reclaim_for_resend(conn, attempt_id, token), "reclaim_for_resend"
                )
                return _Send(attempt_id, token, request, True, previously_started=True)
            case ResumeAction.RECOVER_BY_LOCATOR:
                require_cas(
                    await q.reclaim_for_resend(conn, attempt_id, token), "reclaim_for_resend"
                )
                return _Lookup(attempt_id, token, request)
            case ResumeAction.MARK_AMBIGUOUS:
                require_cas(
                    await q.move_attempt(
                        conn,
                        attempt_id,
                        ["processing", "post_sent"],
                        "ambiguous_remote_effect",
                        last_error="remote I/O had started before this try; outcome unknown",
                    ),
                    "move_attempt",
                )
                return fail(
                    E.AMBIGUOUS_REMOTE_EFFECT,
                    "earlier POST may have landed",
                    await self._view(conn, key),
                )
            case ResumeAction.RESUME_WRITEBACK:
                return StepResult(kind=StepKind.WRITEBACK_PENDING, view=await self._view(conn, key))
            case ResumeAction.NOTHING:
                return StepResult(kind=StepKind.PARKED, view=await self._view(conn, key))

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
        # RemoteIOStartedAt checkpoint are one compare-and-set; otherwise they are two, so
        # a try that stalls after its claim can still be fenced off before it sends (REC-1).
        profile = request.profile
        merged = profile.post_replay_safe or profile.locator_recovery is not None
        claimed = await q.claim_attempt(conn, attempt_id, token, checkpoint=merged)
        if claimed is None:
            return fail(E.TRANSITION_CONFLICT, "attempt not claimable", await self._view(conn, key))
        if deferred:
            # LANE-2: the association-complete body is frozen under this claim.
            await q.freeze_completed_request(
                conn, attempt_id, token, request.model_dump(mode="json")
            )
        return _Send(attempt_id, token, request, checkpointed=merged)

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
        if not plan.checkpointed:
            async with self._pool.acquire() as conn:
                if not await q.checkpoint_remote_io(conn, plan.attempt_id, plan.token):
                    # Another claim owns the row (this try outlived its timeout): send nothing.
                    raise fail(
                        E.TRANSITION_CONFLICT,
                        "claim lost before remote I/O; sent nothing",
                        await self._view(conn, key),
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
            previously_started=plan.previously_started,
        )
        if obs.transport is Transport.NOT_SENT:
            await self._clear_checkpoint(plan)
        outcome = interpret_post(obs, request.response_id_path, request.profile)
        return await self._apply(key, plan, outcome, obs)

    async def _apply(
        self,
        key: str,
        plan: _Send | _Lookup,
        outcome: Created | RemoteRejected | RetrySameRequest | RateLimited | Ambiguous,
        obs: Observation,
    ) -> StepResult:
        status = obs.status
        match outcome:
            case Created(remote_id=remote_id):
                return await self._finalize(key, plan, remote_id, obs, outcome.body_hash)
            case RemoteRejected():
                return await self._park(
                    key,
                    plan,
                    "terminal_failed",
                    E.REMOTE_REJECTED,
                    f"remote rejected the create with {status}",
                    status,
                )
            case RetrySameRequest(reason=reason):
                raise ApplicationError(f"retrying the same frozen request: {reason}", type="Retry")
            case RateLimited(retry_after_seconds=seconds):
                delay = timedelta(seconds=seconds) if seconds is not None else None
                raise ApplicationError("rate limited", type="RateLimited", next_retry_delay=delay)
            case Ambiguous(reason=reason, locator_recovery=True):
                # The next try looks the locator up instead of re-sending (REC-1).
                raise ApplicationError(
                    f"ambiguous ({reason}); recovering by locator", type="LocatorRecovery"
                )
            case Ambiguous(reason=reason):
                return await self._park(
                    key, plan, "ambiguous_remote_effect", E.AMBIGUOUS_REMOTE_EFFECT, reason, status
                )

    async def _finalize(
        self, key: str, plan: _Send | _Lookup, remote_id: str, obs: Observation, body_hash: str
    ) -> StepResult:
        status = obs.status
        # The entity tag, when the remote sends one, guards later PATCHes (If-Match).
        etag = obs.headers.get("etag")
        response = {"status": status, "remote_id": remote_id, "body_hash": body_hash, "etag": etag}
        async with self._pool.acquire() as conn:
            try:
                async with conn.transaction():
                    kind = await finalize_with_mirror(
                        conn, plan.attempt_id, plan.token, remote_id, response
                    )
                    view = await self._view(conn, key)
                    waiting = await self._dependants(conn, view)
                    log.info(
                        "create finalized with remote id %s",
                        remote_id,
                        extra={"link_key": key, "attempt_id": plan.attempt_id},
                    )
                    return StepResult(kind=kind, view=view, dependants=waiting)
            except RemoteLocatorClaimedError:
                pass  # ID-4: another link owns this remote object; park, never PATCH two links
        return await self._park(
            key,
            plan,
            "terminal_failed",
            E.STALE_REMOTE_LOCATOR,
            f"remote id {remote_id} is already linked (stale_remote_locator)",
            status,
            remote_id=remote_id,
        )

    async def _park(
        self,
        key: str,
        plan: _Send | _Lookup,
        target: str,
        kind: E,
        message: str,
        status: int | None,
        remote_id: str | None = None,
    ) -> StepResult:
        async with self._tx(key) as conn:
            moved = await q.move_attempt(
                conn,
                plan.attempt_id,
                ["processing", "post_sent"],
                target,
                token=plan.token,
                last_error=message,
                response={"status": status, "remote_id": remote_id},
            )
            view = await self._view(conn, key)
        if not moved:
            raise fail(E.TRANSITION_CONFLICT, "attempt moved under this claim", view)
        log.warning(
            "attempt parked %s (%s): %s",
            target,
            kind.value,
            message,
            extra={"link_key": key, "attempt_id": plan.attempt_id},
        )
        raise fail(kind, message, view)

    async def _clear_checkpoint(self, plan: _Send) -> None:
        """The request provably never left: the attempt is pre-I/O again (REC-1)."""
        async with self._pool.acquire() as conn:
            await q.clear_checkpoint(conn, plan.attempt_id, plan.token)

    async def _recover_by_locator(self, key: str, plan: _Lookup) -> StepResult:
        request = plan.request
        recovery = request.profile.locator_recovery
        assert recovery is not None and request.locator_value is not None
        path = locator_lookup_path(recovery, request.target_object, request.locator_value)
        obs = await remote.send(self._http, "GET", request.profile, path, {}, None)
        found = interpret_locator_lookup(obs, request.response_id_path)
        match found:
            case LocatorFound(remote_id=remote_id):
                return await self._finalize(key, plan, remote_id, obs, "")
            case LocatorAbsent():
                resend = _Send(plan.attempt_id, plan.token, request, True, previously_started=True)
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
