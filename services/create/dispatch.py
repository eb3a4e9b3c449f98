"""One create dispatch (SPEC POST-1..4, REC-1..4): claim, send, answer, apply, in that
order, or resume whatever a crash left behind; the one operation the create activity
calls. On a finalized link with a PATCH queued it sends the PATCH instead, as the
workflow's next activity would: a PATCH costs one billed activity, not two (NF-6,
P8), and any retry plans afresh from Postgres and resumes the PATCH the same way."""

from __future__ import annotations

from protocol.messages import StepKind, StepResult
from services.create.answer import answer_create, answer_lookup
from services.create.claim import CreateSend, LocatorLookup, claim_create, claim_resend
from services.create.send import look_up_locator, send_create
from services.link_step import LinkStep, QuotaExhausted, StepFailed, quota_wait
from services.pacing import PaceSlot, paced
from services.patch.dispatch import send_queued_patch


async def dispatch_create(step: LinkStep, key: str, slot: PaceSlot) -> StepResult:
    """NF-8: wait for the budget's slot, then claim and send the pending create."""
    if (later := await paced(step.pool, key, slot)) is not None:
        return later  # the budget's next slot is out of reach; nothing was sent
    claim = await claim_create(step, key)
    if isinstance(claim, StepFailed):
        raise claim  # only now: the parked state it reports has committed
    if isinstance(claim, StepResult):
        return await send_queued_patch(step, key) if _patch_is_next(claim) else claim
    if isinstance(claim, LocatorLookup):
        return await _recover_by_locator(step, key, claim)
    return await _send(step, key, claim)


async def _send(step: LinkStep, key: str, plan: CreateSend) -> StepResult:
    sent, obs = await send_create(step, key, plan)
    return await answer_create(step, key, sent, plan.request, obs)


async def _recover_by_locator(step: LinkStep, key: str, lookup: LocatorLookup) -> StepResult:
    obs = await look_up_locator(step, lookup)
    found = await answer_lookup(step, key, lookup, obs)
    if found is not None:
        return found
    # No object carries our locator: every earlier try had no effect, and the remote's
    # uniqueness on the locator refuses a duplicate of a late one. The re-send is a send
    # like any other: the attempt-side drift check runs first (C-5).
    try:
        refusal = await claim_resend(step, key, lookup)
    except QuotaExhausted as exhausted:
        return await quota_wait(step, key, exhausted.wait)
    if refusal is not None:
        raise refusal
    return await _send(step, key, CreateSend(lookup.attempt_id, lookup.token, lookup.request, None))


def _patch_is_next(settled: StepResult) -> bool:
    """A finalized link with queued PATCHes and no deferred create to wake first (those
    the workflow wakes before it asks for the PATCH, LANE-2)."""
    return (
        settled.kind is StepKind.FINALIZED
        and bool(settled.view.pending_patches)
        and not settled.dependants
    )
