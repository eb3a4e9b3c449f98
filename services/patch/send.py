"""Every request the PATCH path sends (SPEC PATCH-3, REC-1, C-2', PROF-2, §17 G-1): the
PATCH itself, behind its fence, and the read-back GETs that may prove an earlier try
applied, each after the send gate passed in the transaction that claimed or
checkpointed it, and each with its journal row. Nothing else on this path reaches the
remote."""

from __future__ import annotations

from datetime import UTC, datetime

from db import journal as jq
from protocol.errors import ActivityErrorType
from protocol.outcome import Observation
from protocol.readback import readback_path, update_path_of
from protocol.send_gate import Refused
from protocol.snapshots import LinkSnapshot
from services import remote
from services.evidence import record_try
from services.link_step import LinkStep, StepFailed, fenced, lock_link, view
from services.patch.gate import gate_read_back, refuse_patch
from services.patch.plan import PatchSend


class ReadBackRefused(Exception):
    """The send gate refused a read-back (G-1): the PATCH is parked and the link suspended
    as the matrix says, in the gate's transaction; nothing was read."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.detail)
        self.refused = refused


async def send_patch(step: LinkStep, key: str, plan: PatchSend) -> tuple[int, Observation]:
    """REC-1: write this try's checkpoint and journal row under its claim (unless the
    claim wrote them), then send the frozen PATCH; its journal row and the answer."""
    journal_id = await fenced(
        step,
        key,
        plan.journal_id,
        lambda conn: jq.checkpoint_patch(conn, plan.patch_id, plan.token),
        "PATCH claim lost; sent nothing",
    )
    step.heartbeat()
    obs = await remote.send(
        step.http,
        "PATCH",
        plan.contract,
        plan.path,
        plan.headers,
        plan.body,
        deadline=step.deadline,
        turn=step.turn(plan.link.remote_scope),
    )
    return journal_id, obs.model_copy(update={"now": datetime.now(UTC)})


async def read_back(step: LinkStep, plan: PatchSend) -> Observation:
    """GET the linked object (the profile's read-back path, else the update path): a
    read, never a re-send, with its own journal row (kind `readback`) and its outcome."""
    await step.hooks.before_read_back(str(plan.patch_id))
    journal_id = await _read_back_checkpoint(step, plan)
    step.heartbeat()
    path = readback_path(plan.contract, plan.link, plan.path)
    turn = step.turn(plan.link.remote_scope)
    obs = await remote.send(
        step.http, "GET", plan.contract, path, {}, None, deadline=step.deadline, turn=turn
    )
    obs = obs.model_copy(update={"now": datetime.now(UTC)})
    async with step.pool.acquire() as conn:
        await record_try(conn, journal_id, obs)
    return obs


async def read_linked_object(step: LinkStep, link: LinkSnapshot) -> Observation | Refused:
    """An operator's read of the linked object (revalidating a `remote_conflict` link,
    PROF-2), after the send gate in its own transaction; no PATCH owns it, so it has no
    journal row. A refusal reads nothing."""
    async with step.tx(link.link_key) as conn:
        gate = await gate_read_back(conn, link)
    if isinstance(gate, Refused):
        return gate
    step.heartbeat()
    path = readback_path(link.profile, link, update_path_of(link))
    turn = step.turn(link.remote_scope)
    return await remote.send(
        step.http, "GET", link.profile, path, {}, None, deadline=step.deadline, turn=turn
    )


async def _read_back_checkpoint(step: LinkStep, plan: PatchSend) -> int:
    """The read-back's journal row: the claim's, when the claim gated this read (a PATCH
    resumed for its read-back), else one written now, after the gate, under the claim."""
    if plan.read_back_only and plan.read_back_journal_id is not None:
        return plan.read_back_journal_id
    key = plan.link.link_key
    journal_id: int | None = None
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        gate = await gate_read_back(conn, plan.link)
        if isinstance(gate, Refused):
            await refuse_patch(conn, key, plan.patch_id, plan.token, gate)
        elif (journal_id := await jq.checkpoint_read_back(conn, plan.patch_id, plan.token)) is None:
            lost = StepFailed(
                ActivityErrorType.TRANSITION_CONFLICT, "PATCH claim lost", await view(conn, key)
            )
    # Raised once the transaction committed what the refusal leads to.
    if isinstance(gate, Refused):
        raise ReadBackRefused(gate)
    if journal_id is None:
        raise lost
    return journal_id
