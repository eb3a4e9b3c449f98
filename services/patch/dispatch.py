"""One PATCH dispatch (SPEC PATCH-1..3): claim, send, answer, apply, in that order; the
one operation the PATCH activity calls, and the create activity's too when it finds
the link finalized with a PATCH queued (one activity per PATCH: issue 16, P8)."""

from __future__ import annotations

from protocol.messages import StepResult
from protocol.outcome import PatchOutcome
from services.link_step import LinkStep
from services.pacing import PaceSlot, paced
from services.patch.answer import answer_patch, confirm_by_read_back
from services.patch.apply import apply_patch_outcome
from services.patch.claim import claim_patch
from services.patch.send import send_patch


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
    else:
        journal_id, obs = await send_patch(step, key, plan)
        outcome = await answer_patch(step, plan, obs)
    return await apply_patch_outcome(step, key, plan, journal_id, outcome, obs)
