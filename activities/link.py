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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

import asyncpg
import httpx
from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import remote
from activities.deferred import resolve_deferred
from activities.hooks import DispatchHooks
from activities.mirror import MIRROR_ATTEMPTS, finalize_with_mirror, write_mirror_now
from activities.operator import apply_operator_action, park_in_flight
from activities.patch import plan_patch, record_outcome
from activities.record_store import PostgresRecordStore
from activities.rows import link_view, request_of
from db import links as q
from db import patches as pq
from db.errors import RemoteLocatorClaimedError
from db.records import Conn
from protocol.deferred import Waiting
from protocol.errors import ActivityErrorType as E
from protocol.messages import (
    DispatchInput,
    EvidenceInput,
    LinkView,
    MirrorInput,
    OperatorActionInput,
    OperatorResult,
    ParkInput,
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
    interpret_patch,
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


_tracer = trace.get_tracer(__name__)
log = logging.getLogger(__name__)


def _fail(kind: E, message: str, view: LinkView) -> ApplicationError:
    """A non-retryable error carrying the durable view the workflow publishes (§5.4)."""
    return ApplicationError(
        message, view.model_dump(mode="json"), type=kind.value, non_retryable=True
    )


class LinkActivities:
    """Activities bound to the worker's pool and HTTP client."""

    def __init__(
        self, pool: asyncpg.Pool, http: httpx.AsyncClient, hooks: DispatchHooks | None = None
    ) -> None:
        self._pool = pool
        self._http = http
        self._hooks = hooks or DispatchHooks()

    @asynccontextmanager
    async def _tx(self, key: str) -> AsyncIterator[Conn]:
        """One Postgres transaction of this activity, traced with the link key (NF-1)."""
        name = activity.info().activity_type if activity.in_activity() else "transaction"
        with _tracer.start_as_current_span(f"postgres {name}", attributes={"link_key": key}):
            async with self._pool.acquire() as conn, conn.transaction():
                yield conn

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
                return _fail(E.LANE_NOT_CLAIMABLE, f"lane {attempt['dispatch_lane']!r}", view)
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
                assert await q.reclaim_for_resend(conn, attempt_id, token)
                return _Send(attempt_id, token, request, True, previously_started=True)
            case ResumeAction.RECOVER_BY_LOCATOR:
                assert await q.reclaim_for_resend(conn, attempt_id, token)
                return _Lookup(attempt_id, token, request)
            case ResumeAction.MARK_AMBIGUOUS:
                await q.move_attempt(
                    conn,
                    attempt_id,
                    ["processing", "post_sent"],
                    "ambiguous_remote_effect",
                    last_error="remote I/O had started before this try; outcome unknown",
                )
                return _fail(
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
            await q.move_attempt(
                conn,
                attempt_id,
                ["pending", "processing"],
                "terminal_failed",
                last_error="source_deleted",
            )
            return _fail(
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
            return _fail(
                E.TRANSITION_CONFLICT, "attempt not claimable", await self._view(conn, key)
            )
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
            await q.move_attempt(
                conn,
                str(attempt["attempt_id"]),
                ["pending", "processing"],
                "terminal_failed",
                last_error=f"association: {completed.detail}",
            )
            return _fail(E.GATE_FAILED, completed.detail, await self._view(conn, key))
        return completed

    async def _send(self, key: str, plan: _Send) -> StepResult:
        await self._hooks.before_checkpoint(plan.attempt_id)
        if not plan.checkpointed:
            async with self._pool.acquire() as conn:
                if not await q.checkpoint_remote_io(conn, plan.attempt_id, plan.token):
                    # Another claim owns the row (this try outlived its timeout): send nothing.
                    raise _fail(
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
                    waiting = await self._dependants(conn, key)
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
            raise _fail(E.TRANSITION_CONFLICT, "attempt moved under this claim", view)
        log.warning(
            "attempt parked %s (%s): %s",
            target,
            kind.value,
            message,
            extra={"link_key": key, "attempt_id": plan.attempt_id},
        )
        raise _fail(kind, message, view)

    async def _clear_checkpoint(self, plan: _Send) -> None:
        """The request provably never left: the attempt is pre-I/O again (REC-1)."""
        async with self._pool.acquire() as conn:
            await conn.execute(
                """
                UPDATE connector_push_attempt SET remote_io_started_at = NULL
                WHERE attempt_id = $1 AND claim_token = $2 AND status = 'processing'
                """,
                uuid.UUID(plan.attempt_id),
                plan.token,
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
                return await self._finalize(key, plan, remote_id, obs, "")
            case LocatorAbsent():
                resend = _Send(plan.attempt_id, plan.token, request, True, previously_started=True)
                return await self._send(key, resend)
            case Ambiguous(reason=reason):
                raise ApplicationError(
                    f"locator lookup inconclusive: {reason}", type="LocatorRecovery"
                )

    # -- PATCH (PATCH-1..3) -------------------------------------------------------------

    @activity.defn
    async def dispatch_patch(self, input: DispatchInput) -> StepResult:
        """Claim the queued PATCH, gate it, send it to the link's remote id, record the outcome."""
        key = input.link_key
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            plan = await plan_patch(conn, key)
            if plan is None:
                return await self._settled(conn, key)
        if not plan.checkpointed:
            async with self._pool.acquire() as conn:
                if not await pq.checkpoint_patch(conn, plan.patch_id, plan.token):
                    raise _fail(E.TRANSITION_CONFLICT, "PATCH claim lost; sent nothing",
                                await self._view(conn, key))  # fmt: skip
        activity.heartbeat()
        obs = await remote.send(
            self._http,
            "PATCH",
            plan.link.profile,
            plan.path,
            plan.headers,
            plan.body,
            previously_started=plan.checkpointed,
        )
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            if obs.transport is Transport.NOT_SENT:
                await pq.clear_patch_checkpoint(conn, plan.patch_id, plan.token)
            outcome = interpret_patch(obs, plan.link.profile.patch_replay_safe)
            await record_outcome(conn, plan, outcome, obs)
            return await self._settled(conn, key)

    @activity.defn
    async def apply_remote_evidence(self, input: EvidenceInput) -> StepResult:
        """ING-6: the remote deleted the linked object: suspend the link, never re-create."""
        ev = input.evidence
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            detail = f"event {ev.event_id}: {ev.detail or ev.reason}"
            evidence = [{"surface": "remote", "disposition": "fail_closed", "detail": detail}]
            await pq.suspend_link(conn, input.link_key, ev.reason, evidence)
            await pq.supersede_queued(conn, input.link_key, f"link suspended: {ev.reason}")
            return await self._settled(conn, input.link_key)

    @activity.defn
    async def park_exhausted(self, input: ParkInput) -> StepResult:
        """REC-3: retries ran out; park what is in flight durably, never delete it."""
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            await park_in_flight(conn, input.link_key, input.error)
            return await self._settled(conn, input.link_key)

    # -- mirror and views -----------------------------------------------------------

    @activity.defn
    async def write_mirror(self, input: MirrorInput) -> StepResult:
        """Retry the compatibility mirror only; never re-POST (POST-3)."""
        give_up = activity.info().attempt >= MIRROR_ATTEMPTS
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            kind = await write_mirror_now(conn, input.attempt_id, give_up=give_up)
            view = await self._view(conn, input.link_key)
        if kind is None:
            raise ApplicationError(
                "mirror compare-and-set conflict; retrying the mirror only", type="MirrorConflict"
            )
        return StepResult(kind=kind, view=view)

    @activity.defn
    async def apply_operator_action(self, input: OperatorActionInput) -> OperatorResult:
        """Apply one operator update under the link lock, re-checking it against Postgres."""
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            message = await apply_operator_action(conn, input, self._view)
            return OperatorResult(
                accepted=True, message=message, view=await self._view(conn, input.link_key)
            )

    async def _settled(self, conn: Conn, key: str) -> StepResult:
        view = await self._view(conn, key)
        if view.needs_operator:
            return StepResult(kind=StepKind.PARKED, view=view)
        kind = StepKind.FINALIZED if view.link_status is not None else StepKind.IDLE
        return StepResult(kind=kind, view=view)

    @staticmethod
    async def _dependants(conn: Conn, key: str) -> list[str]:
        """Deferred creates waiting on this newly finalized link (LANE-2)."""
        link = await q.link_by_key(conn, key)
        if link is None:
            return []
        return await q.deferred_dependants(
            conn, link["connector_owner_key"], link["source_record_id"]
        )

    @staticmethod
    async def _view(conn: Conn, key: str) -> LinkView:
        return link_view(
            key,
            await q.link_by_key(conn, key),
            await q.latest_attempt(conn, key),
            await q.pending_patch_statuses(conn, key),
            await q.last_patch_status(conn, key),
        )
