"""What a PATCH's outcome does (SPEC PATCH-3, PROF-1, JRN-1): finish the PATCH, suspend
the link, wait and re-send, or retry, recording the try's journal outcome in the same
transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from db import patches as pq
from db.records import Conn
from protocol.errors import SuspendReason
from protocol.messages import StepKind, StepResult
from protocol.outcome import (
    NotApplied,
    Observation,
    PatchAmbiguous,
    PatchConflict,
    PatchEtagMoved,
    PatchFailed,
    PatchOutcome,
    PatchRetry,
    PatchSucceeded,
    PatchSuspendLink,
)
from protocol.recovery import Step, next_step
from protocol.states import PatchStatus
from services.cas import require_cas
from services.evidence import patch_recovery, record_try, retry_delay
from services.link_step import (
    LinkStep,
    RetryKind,
    StepRetry,
    lock_link,
    quota_wait,
    refuse_day,
    settled,
    view,
)
from services.patch.plan import PatchSend

# What the caller does after the outcome committed: wait this many seconds (a "not
# applied" answer, in a workflow timer), raise for a Temporal retry, or nothing.
StepResultHint = float | StepRetry | None


async def apply_patch_outcome(
    step: LinkStep,
    key: str,
    plan: PatchSend,
    journal_id: int | None,
    outcome: PatchOutcome,
    obs: Observation,
) -> StepResult:
    """Record the outcome under the link lock, then say what the link does next."""
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        after = await record_outcome(conn, plan, journal_id, outcome, obs)
        daily = plan.contract.daily_limit if _daily_refusal(outcome) else None
        if isinstance(after, float) and daily is not None:
            # The remote's daily limit (PROF-5): the whole budget waits for the reset.
            link = plan.link
            wait = await refuse_day(
                step, conn, link.remote_scope, link.profile.credential_ref, daily.reset
            )
        elif isinstance(after, float):
            detail = f"PATCH answered {obs.status} (not applied); re-sending in {after} s"
            return StepResult(
                kind=StepKind.RETRY_LATER,
                view=await view(conn, key),
                detail=detail,
                retry_after_seconds=after,
            )
        if after is None:
            return await settled(conn, key)
    if isinstance(after, float) and daily is not None:
        return await quota_wait(step, key, wait)
    assert not isinstance(after, float | None)
    raise after  # a Temporal retry, now that this try's outcome is durable


def _daily_refusal(outcome: PatchOutcome) -> bool:
    return isinstance(outcome, NotApplied) and outcome.daily_limit


async def record_outcome(
    conn: Conn, plan: PatchSend, journal_id: int | None, outcome: PatchOutcome, obs: Observation
) -> StepResultHint:
    """Persist what the remote said (PATCH-3) with this try's journal outcome, in the
    caller's transaction; see `StepResultHint` for what the caller does next."""
    await record_try(conn, journal_id, obs, daily_refusal=_daily_refusal(outcome))
    response = {"status": obs.status, "transport": obs.transport.value}
    match outcome:
        case PatchSucceeded(etag=read_etag):
            if etag := read_etag or obs.headers.get("etag"):
                await pq.set_remote_etag(conn, plan.link.link_key, etag)
            await _finish(conn, plan, PatchStatus.SUCCEEDED, None, response)
        case PatchSuspendLink(reason=reason, status=status):
            await _finish(
                conn, plan, PatchStatus.FAILED, f"remote {status}: {reason.value}", response
            )
            await _suspend(conn, plan.link.link_key, reason, f"PATCH answered {status}")
        case PatchEtagMoved(etag=etag):
            # Our own earlier PATCH moved the tag: keep the new one; the same frozen body
            # goes again (this try's 412 proves it was not applied).
            if etag:
                await pq.set_remote_etag(conn, plan.link.link_key, etag)
            return StepRetry(
                RetryKind.PATCH_RETRY, "entity tag moved by an earlier PATCH of ours; re-sending"
            )
        case PatchConflict(status=status):
            # A conflict the read-back did not resolve (or no read-back declared).
            reason = SuspendReason.REMOTE_CONFLICT
            await _finish(
                conn, plan, PatchStatus.FAILED, f"remote {status}: {reason.value}", response
            )
            await _suspend(conn, plan.link.link_key, reason, f"PATCH answered {status}")
        case PatchFailed(status=status):
            message = f"remote rejected the PATCH with {status}"
            await _finish(conn, plan, PatchStatus.FAILED, message, response)
        case PatchAmbiguous(reason=reason):
            await _finish(conn, plan, PatchStatus.AMBIGUOUS_REMOTE_EFFECT, reason, response)
        case NotApplied(retry_after_seconds=seconds):
            return await _not_applied(conn, plan, seconds, obs)
        case PatchRetry(retry_after_seconds=seconds):
            # Returned, not raised: this try's journal outcome must commit first.
            delay = timedelta(seconds=seconds) if seconds is not None else None
            return StepRetry(RetryKind.PATCH_RETRY, "PATCH will be retried", delay)
    return None


async def _not_applied(
    conn: Conn, plan: PatchSend, retry_after: float | None, obs: Observation
) -> StepResultHint:
    patch = await pq.patch_by_id(conn, plan.patch_id)
    assert patch is not None, "unfinished PATCHes are never deleted"
    recovery = await patch_recovery(conn, patch, plan.contract)
    decision = next_step(recovery.model_copy(update={"now": obs.now}))
    if decision.step is Step.PARK_AMBIGUOUS:
        await _finish(conn, plan, PatchStatus.AMBIGUOUS_REMOTE_EFFECT, decision.reason, None)
    elif decision.step is Step.TERMINAL:
        await _finish(conn, plan, PatchStatus.FAILED, decision.reason, None)
    else:
        return retry_delay(retry_after, plan.contract)
    return None


async def _finish(
    conn: Conn,
    plan: PatchSend,
    target: PatchStatus,
    error: str | None,
    response: dict[str, Any] | None,
) -> None:
    require_cas(
        await pq.finish_patch(
            conn, plan.patch_id, target, token=plan.token, last_error=error, response=response
        ),
        "finish_patch",
    )


async def _suspend(conn: Conn, key: str, reason: SuspendReason, detail: str) -> None:
    evidence = [{"surface": "remote", "disposition": "fail_closed", "detail": detail}]
    await pq.suspend_link(conn, key, reason.value, evidence)
    await pq.supersede_queued(conn, key, f"link suspended: {reason.value}")
