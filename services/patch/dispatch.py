"""One PATCH dispatch (SPEC PATCH-1..3): claim, send, answer, apply, in that order; the
one operation the PATCH activity calls, and the create activity's too when it finds
the link finalized with a PATCH queued (one activity per PATCH: NF-6, bench P8)."""

from __future__ import annotations

from protocol.messages import StepResult
from protocol.outcome import PatchOutcome
from services.evidence import record_try
from services.link_step import LinkStep, settled
from services.pacing import PaceSlot, paced
from services.patch.answer import answer_patch, confirm_by_read_back
from services.patch.apply import apply_patch_outcome
from services.patch.claim import claim_patch
from services.patch.send import ReadBackRefused, send_patch


async def dispatch_patch(step: LinkStep, key: str, slot: PaceSlot) -> StepResult:
    """NF-8: wait for the budget's slot, then send the link's queued PATCH."""
    if (later := await paced(step.pool, key, slot)) is not None:
        return later  # the budget's next slot is out of reach; nothing was sent
    return await send_queued_patch(step, key)


async def send_queued_patch(step: LinkStep, key: str) -> StepResult:
    """Claim the queued PATCH, gate it, send it to the link's remote id, record the outcome."""
    plan = await claim_patch(step, key)
    if isinstance(plan, StepResult):
        return plan
    journal_id: int | None = None
    outcome: PatchOutcome
    if plan.read_back_only:
        # C-2: an earlier try may have landed; a GET may prove it, nothing is sent.
        outcome, obs = await confirm_by_read_back(step, plan, "an earlier try may have landed")
        return await apply_patch_outcome(step, key, plan, journal_id, outcome, obs)
    journal_id, obs = await send_patch(step, key, plan)
    try:
        outcome = await answer_patch(step, plan, obs)
    except ReadBackRefused:
        # G-1 refused the read-back that would settle this try, and parked the PATCH;
        # this try's own outcome is evidence all the same (JRN-1).
        async with step.tx(key) as conn:
            await record_try(conn, journal_id, obs)
            return await settled(conn, key)
    return await apply_patch_outcome(step, key, plan, journal_id, outcome, obs)
