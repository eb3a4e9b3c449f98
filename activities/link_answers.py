"""What a create's answer does to its attempt (SPEC POST-2..4, PROF-1, JRN-1): finalize,
wait and re-send, or park for an operator, recording the try in the same transaction.
Shared by the create activity's send and its locator lookup; not an activity itself."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from temporalio.exceptions import ApplicationError

from activities.link_base import fail
from activities.patch_dispatch import PatchDispatch
from db import links as q
from db.errors import RemoteLocatorClaimedError
from db.records import Conn
from protocol.daily_quota import names_daily_policy
from protocol.errors import ActivityErrorType as E
from protocol.messages import (
    StepKind,
    StepResult,
)
from protocol.outcome import (
    Ambiguous,
    Created,
    NotApplied,
    Observation,
    PostOutcome,
    RateLimited,
    RemoteRejected,
    RetrySameRequest,
    body_hash,
)
from protocol.recovery import Decision, Step, next_step, on_definite_rejection
from services import daily_quota
from services.cas import require_cas
from services.evidence import attempt_recovery, owner_of_remote_id, record_try, retry_delay
from services.mirror import finalize_with_mirror
from services.rows import request_of


@dataclass(frozen=True)
class SentTry:
    """One try that passed its fence: its claim and its journal row (None for a GET)."""

    attempt_id: str
    token: uuid.UUID
    journal_id: int | None


log = logging.getLogger(__name__)


class CreateAnswers(PatchDispatch):
    """The create path's outcomes; `LinkActivities` claims and sends."""

    async def _park_planned(
        self, conn: Conn, key: str, attempt_id: str, decision: Decision
    ) -> ApplicationError:
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
        return fail(kind, decision.reason, await self._view(conn, key))

    async def _apply(
        self, key: str, sent: SentTry, outcome: PostOutcome, obs: Observation
    ) -> StepResult:
        match outcome:
            case Created(remote_id=remote_id):
                return await self._finalize(key, sent, remote_id, obs, outcome.body_hash)
            case RemoteRejected():
                return await self._rejected(key, sent, obs)
            case NotApplied():
                return await self._not_applied(key, sent, obs, outcome)
            case RetrySameRequest(reason=reason):
                await self._record_only(sent, obs)
                raise ApplicationError(f"retrying the same frozen request: {reason}", type="Retry")
            case RateLimited(retry_after_seconds=seconds):
                await self._record_only(sent, obs)
                delay = timedelta(seconds=seconds) if seconds is not None else None
                raise ApplicationError("rate limited", type="RateLimited", next_retry_delay=delay)
            case Ambiguous(reason=reason, locator_recovery=True):
                # The next try looks the locator up instead of re-sending (REC-1).
                await self._record_only(sent, obs)
                raise ApplicationError(
                    f"ambiguous ({reason}); recovering by locator", type="LocatorRecovery"
                )
            case Ambiguous(reason=reason):
                return await self._park(
                    key, sent, obs, "ambiguous_remote_effect", E.AMBIGUOUS_REMOTE_EFFECT, reason
                )

    async def _not_applied(
        self, key: str, sent: SentTry, obs: Observation, outcome: NotApplied
    ) -> StepResult:
        """PROF-1: this try had no effect; wait Retry-After in the workflow (not the retry
        budget) and send the same frozen request again, until the time budget is spent."""
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            await record_try(conn, sent.journal_id, obs)
            attempt = await q.attempt_by_id(conn, sent.attempt_id)
            assert attempt is not None, "attempts are never deleted"
            request = request_of(attempt)
            profile = request.profile
            recovery = await attempt_recovery(conn, attempt, profile)
            decision = next_step(recovery.model_copy(update={"now": obs.now}))
            if decision.step in {Step.PARK_AMBIGUOUS, Step.TERMINAL}:
                refusal = await self._park_planned(conn, key, sent.attempt_id, decision)
            elif names_daily_policy(obs.status, obs.body):
                wait = await daily_quota.refuse_day(
                    self._pool,
                    conn,
                    request.remote_scope,
                    profile.credential_ref,
                    self._hooks.now(),
                )
            else:
                delay = retry_delay(outcome.retry_after_seconds, profile)
                view = await self._view(conn, key)
                detail = f"remote answered {outcome.status} (not applied); re-sending in {delay} s"
                return StepResult(
                    kind=StepKind.RETRY_LATER, view=view, detail=detail, retry_after_seconds=delay
                )
        if decision.step in {Step.PARK_AMBIGUOUS, Step.TERMINAL}:
            raise refusal
        # The remote's daily limit: the whole budget waits for the reset (issue 33 item 3).
        return await self._quota_wait(key, wait)

    async def _rejected(self, key: str, sent: SentTry, obs: Observation) -> StepResult:
        """POST-4 as corrected by C-1: a definite rejection ends the attempt terminal only
        if no try of it may have landed; after one that may have (a same-key re-send
        answered 422 or 409), the refusal may be the remote saying the object exists, so
        the attempt parks ambiguous for reconcile, never terminal (never superseded)."""
        assert obs.status is not None
        async with self._tx(key) as conn:
            await record_try(conn, sent.journal_id, obs)
            attempt = await q.attempt_by_id(conn, sent.attempt_id)
            assert attempt is not None, "attempts are never deleted"
            recovery = await attempt_recovery(conn, attempt, request_of(attempt).profile)
        decision = on_definite_rejection(recovery, obs.status)
        if decision.step is Step.PARK_AMBIGUOUS:
            target, kind = "ambiguous_remote_effect", E.AMBIGUOUS_REMOTE_EFFECT
        else:
            target, kind = "terminal_failed", E.REMOTE_REJECTED
        return await self._park(key, sent, obs, target, kind, decision.reason, recorded=True)

    async def _record_only(self, sent: SentTry, obs: Observation) -> None:
        async with self._pool.acquire() as conn:
            await record_try(conn, sent.journal_id, obs)

    async def _finalize(
        self, key: str, sent: SentTry, remote_id: str, obs: Observation, body_hash: str
    ) -> StepResult:
        status = obs.status
        # The entity tag, when the remote sends one, guards later PATCHes (If-Match).
        etag = obs.headers.get("etag")
        response = {"status": status, "remote_id": remote_id, "body_hash": body_hash, "etag": etag}
        async with self._pool.acquire() as conn:
            try:
                async with conn.transaction():
                    # The link key's lock, like admission: otherwise an admission could read
                    # "no link" before this commits and "attempt finalized, slot free" after
                    # it (READ COMMITTED, statement by statement) and reserve a second create.
                    await q.lock_link_key(conn, key)
                    await record_try(conn, sent.journal_id, obs, remote_id)
                    kind = await finalize_with_mirror(
                        conn, sent.attempt_id, sent.token, remote_id, response
                    )
                    view = await self._view(conn, key)
                    waiting = await self._dependants(conn, view)
                    log.info(
                        "create finalized with remote id %s",
                        remote_id,
                        extra={"link_key": key, "attempt_id": sent.attempt_id},
                    )
                    return StepResult(kind=kind, view=view, dependants=waiting)
            except RemoteLocatorClaimedError:
                owner = await owner_of_remote_id(conn, sent.attempt_id, remote_id)
            except ApplicationError as lost:
                if lost.type != E.TRANSITION_CONFLICT.value:
                    raise
                # This try's claim is gone (it outlived its timeout and a retry claimed or
                # parked the attempt), so it finalizes nothing; but the answer it got is
                # evidence that only grows (JRN-1): keep the outcome and the remote id for
                # the operator who reconciles, then fail as before.
                await record_try(conn, sent.journal_id, obs, remote_id)
                log.warning(
                    "create answered with remote id %s after this try lost its claim",
                    remote_id,
                    extra={"link_key": key, "attempt_id": sent.attempt_id},
                )
                raise
        # ID-4: another link owns this remote object: never PATCH two links to one object.
        # Our create may have landed (the remote answered with an id), so the attempt parks
        # ambiguous for an operator, never terminal (JRN-2).
        return await self._park(
            key,
            sent,
            obs,
            "ambiguous_remote_effect",
            E.STALE_REMOTE_LOCATOR,
            f"remote id {remote_id} is already linked to {owner} (stale_remote_locator)",
            remote_id=remote_id,
        )

    async def _park(
        self,
        key: str,
        sent: SentTry,
        obs: Observation,
        target: str,
        kind: E,
        message: str,
        remote_id: str | None = None,
        recorded: bool = False,
    ) -> StepResult:
        async with self._tx(key) as conn:
            if not recorded:
                await record_try(conn, sent.journal_id, obs, remote_id)
            moved = await q.move_attempt(
                conn,
                sent.attempt_id,
                ["processing", "post_sent"],
                target,
                token=sent.token,
                last_error=message,
                # P-23: what the answer was, like a 201's snapshot (POST-2).
                response={
                    "status": obs.status,
                    "remote_id": remote_id,
                    "body_hash": body_hash(obs.body),
                    "etag": obs.headers.get("etag"),
                },
            )
            view = await self._view(conn, key)
        if not moved:
            raise fail(E.TRANSITION_CONFLICT, "attempt moved under this claim", view)
        log.warning(
            "attempt parked %s (%s): %s",
            target,
            kind.value,
            message,
            extra={"link_key": key, "attempt_id": sent.attempt_id},
        )
        raise fail(kind, message, view)
