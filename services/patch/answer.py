"""What the remote's answer to a PATCH means (SPEC PATCH-3, C-2, PROF-2): the outcome
`protocol.outcome.interpret_patch` reads from it, settled by a read-back where the
profile declares one and an earlier write of ours may explain a conflict or a silence."""

from __future__ import annotations

from pydantic import JsonValue

from protocol.outcome import (
    Observation,
    PatchAmbiguous,
    PatchConflict,
    PatchEtagMoved,
    PatchOutcome,
    PatchRetry,
    PatchSucceeded,
    Transport,
    interpret_patch,
    parse_json,
)
from protocol.readback import readback_matches
from protocol.recovery import Step, on_patch_conflict
from services.link_step import LinkStep
from services.patch.plan import PatchSend
from services.patch.send import read_back


async def answer_patch(step: LinkStep, plan: PatchSend, obs: Observation) -> PatchOutcome:
    """The outcome of this try's PATCH, read back where that may settle it."""
    outcome = interpret_patch(obs, plan.contract)
    if isinstance(outcome, PatchConflict):
        return await _resolve_conflict(step, plan, outcome)
    if isinstance(outcome, PatchAmbiguous) and plan.contract.readback:
        # C-2: this try may have landed; it is never sent again, but a declared
        # read-back may prove it applied. The try's own outcome is journalled.
        outcome, _ = await confirm_by_read_back(step, plan, outcome.reason)
    return outcome


async def confirm_by_read_back(
    step: LinkStep, plan: PatchSend, why: str
) -> tuple[PatchSucceeded | PatchAmbiguous, Observation]:
    """C-2 / PROF-2: GET the object; holding every value of the frozen body, the PATCH
    was applied (`succeeded`, the read's ETag stored); anything else (a different
    value, an unreadable object) leaves it `ambiguous_remote_effect`. A read, never a
    re-send: the returned observation is the GET's."""
    obs = await read_back(step, plan)
    if obs.transport is not Transport.RESPONSE or obs.status != 200:
        return PatchAmbiguous(reason=f"{why}; read-back inconclusive"), obs
    if readback_matches(plan.body, parse_json(obs.body)):
        return PatchSucceeded(etag=obs.headers.get("etag")), obs
    return PatchAmbiguous(reason=f"{why}; read-back differs from the frozen body"), obs


async def read_object(step: LinkStep, plan: PatchSend) -> tuple[JsonValue, str | None] | None:
    """The linked object and its entity tag, or None when the read-back did not answer 200."""
    return object_read(await read_back(step, plan))


def object_read(obs: Observation) -> tuple[JsonValue, str | None] | None:
    """The object a read-back answered with and its entity tag; None unless a 200."""
    if obs.transport is not Transport.RESPONSE or obs.status != 200:
        return None
    return parse_json(obs.body), obs.headers.get("etag")


async def _resolve_conflict(
    step: LinkStep, plan: PatchSend, conflict: PatchConflict
) -> PatchConflict | PatchSucceeded | PatchEtagMoved | PatchRetry:
    """PROF-2: a 409/412 after a write of ours that may have landed (an earlier try of
    this PATCH, or an earlier PATCH that ended ambiguous): read the object back. Holding
    this PATCH's values, it was applied; holding an earlier PATCH's, the entity tag moved
    because of us and this PATCH goes again; anything else is a real conflict."""
    earlier = plan.earlier_may_have_landed + len(plan.earlier_bodies)
    decision = on_patch_conflict(earlier, plan.contract)
    if decision.step is not Step.READ_BACK:
        return conflict
    read = await read_object(step, plan)
    if read is None:
        return PatchRetry()  # inconclusive: retried once the 412 is in the journal
    document, etag = read
    if readback_matches(plan.body, document):
        return PatchSucceeded(etag=etag)
    if any(readback_matches(body, document) for body in plan.earlier_bodies):
        return PatchEtagMoved(etag=etag)
    return conflict
