"""What the remote's answer to a create means (SPEC POST-2..4, PROF-1, C-1, REC-4): the
outcome `protocol.outcome` reads from it and the step it leads to: finalize, wait and
re-send, retry, or park for an operator, with the try recorded in the same transaction."""

from __future__ import annotations

from datetime import timedelta

from db import links as q
from protocol.errors import ActivityErrorType as E
from protocol.messages import StepKind, StepResult
from protocol.outcome import (
    Ambiguous,
    Created,
    LocatorAbsent,
    LocatorFound,
    NotApplied,
    Observation,
    RateLimited,
    RemoteRejected,
    RetrySameRequest,
    interpret_locator_lookup,
    interpret_post,
    lookup_id_path,
)
from protocol.recovery import Step, next_step, on_definite_rejection
from protocol.snapshots import CreateRequestSnapshot
from services.create.apply import finalize, park, record_only
from services.create.claim import LocatorLookup, park_planned
from services.create.send import SentTry
from services.evidence import attempt_recovery, record_try, retry_delay
from services.link_step import (
    LinkStep,
    RetryKind,
    StepRetry,
    lock_link,
    quota_wait,
    refuse_day,
    view,
)
from services.rows import request_of


async def answer_create(
    step: LinkStep, key: str, sent: SentTry, request: CreateRequestSnapshot, obs: Observation
) -> StepResult:
    """Apply what the remote answered this try of the frozen `request`."""
    outcome = interpret_post(obs, request.response_id_path, request.profile)
    match outcome:
        case Created(remote_id=remote_id):
            return await finalize(step, key, sent, remote_id, obs, outcome.body_hash)
        case RemoteRejected():
            return await _rejected(step, key, sent, obs)
        case NotApplied():
            return await _not_applied(step, key, sent, obs, outcome)
        case RetrySameRequest(reason=reason):
            await record_only(step, sent, obs)
            raise StepRetry(RetryKind.RETRY, f"retrying the same frozen request: {reason}")
        case RateLimited(retry_after_seconds=seconds):
            await record_only(step, sent, obs)
            delay = timedelta(seconds=seconds) if seconds is not None else None
            raise StepRetry(RetryKind.RATE_LIMITED, "rate limited", delay)
        case Ambiguous(reason=reason, locator_recovery=True):
            # The next try looks the locator up instead of re-sending (REC-1).
            await record_only(step, sent, obs)
            raise StepRetry(
                RetryKind.LOCATOR_RECOVERY, f"ambiguous ({reason}); recovering by locator"
            )
        case Ambiguous(reason=reason):
            return await park(
                step, key, sent, obs, "ambiguous_remote_effect", E.AMBIGUOUS_REMOTE_EFFECT, reason
            )


async def answer_lookup(
    step: LinkStep, key: str, lookup: LocatorLookup, obs: Observation
) -> StepResult | None:
    """A found object finalizes the attempt (whatever drifted since); None: no object
    carries our locator, so every earlier try had no effect and the caller re-sends."""
    request = lookup.request
    found = interpret_locator_lookup(obs, lookup_id_path(request.response_id_path, request.profile))
    match found:
        case LocatorFound(remote_id=remote_id):
            sent = SentTry(lookup.attempt_id, lookup.token, None)
            return await finalize(step, key, sent, remote_id, obs, "")
        case LocatorAbsent():
            return None
        case Ambiguous(reason=reason, locator_recovery=False):
            # The locator names more than one object: no later look-up can tell which.
            sent = SentTry(lookup.attempt_id, lookup.token, None)
            target, kind = "ambiguous_remote_effect", E.AMBIGUOUS_REMOTE_EFFECT
            return await park(step, key, sent, obs, target, kind, reason)
        case Ambiguous(reason=reason):
            raise StepRetry(RetryKind.LOCATOR_RECOVERY, f"locator lookup inconclusive: {reason}")


async def _not_applied(
    step: LinkStep, key: str, sent: SentTry, obs: Observation, outcome: NotApplied
) -> StepResult:
    """PROF-1: this try had no effect; wait Retry-After in the workflow (not the retry
    budget) and send the same frozen request again, until the time budget is spent."""
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        await record_try(conn, sent.journal_id, obs, daily_refusal=outcome.daily_limit)
        attempt = await q.attempt_by_id(conn, sent.attempt_id)
        assert attempt is not None, "attempts are never deleted"
        request = request_of(attempt)
        profile = request.profile
        recovery = await attempt_recovery(conn, attempt, profile)
        decision = next_step(recovery.model_copy(update={"now": obs.now}))
        if decision.step in {Step.PARK_AMBIGUOUS, Step.TERMINAL}:
            refusal = await park_planned(conn, key, sent.attempt_id, decision)
        elif outcome.daily_limit and profile.daily_limit is not None:
            wait = await refuse_day(
                step, conn, request.remote_scope, profile.credential_ref, profile.daily_limit.reset
            )
        else:
            delay = retry_delay(outcome.retry_after_seconds, profile)
            detail = f"remote answered {outcome.status} (not applied); re-sending in {delay} s"
            return StepResult(
                kind=StepKind.RETRY_LATER,
                view=await view(conn, key),
                detail=detail,
                retry_after_seconds=delay,
            )
    if decision.step in {Step.PARK_AMBIGUOUS, Step.TERMINAL}:
        raise refusal
    # The remote's daily limit: the whole budget waits for the reset (PROF-5, NF-8).
    return await quota_wait(step, key, wait)


async def _rejected(step: LinkStep, key: str, sent: SentTry, obs: Observation) -> StepResult:
    """POST-4 as corrected by C-1: a definite rejection ends the attempt terminal only
    if no try of it may have landed; after one that may have (a same-key re-send
    answered 422 or 409), the refusal may be the remote saying the object exists, so
    the attempt parks ambiguous for reconcile, never terminal (never superseded)."""
    assert obs.status is not None
    async with step.tx(key) as conn:
        await record_try(conn, sent.journal_id, obs)
        attempt = await q.attempt_by_id(conn, sent.attempt_id)
        assert attempt is not None, "attempts are never deleted"
        recovery = await attempt_recovery(conn, attempt, request_of(attempt).profile)
    decision = on_definite_rejection(recovery, obs.status)
    if decision.step is Step.PARK_AMBIGUOUS:
        target, kind = "ambiguous_remote_effect", E.AMBIGUOUS_REMOTE_EFFECT
    else:
        target, kind = "terminal_failed", E.REMOTE_REJECTED
    return await park(step, key, sent, obs, target, kind, decision.reason, recorded=True)
