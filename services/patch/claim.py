"""Claiming a link's PATCH (SPEC PATCH-2, REC-1, REC-4, C-2', §17 G-1): under the link
lock, resume the PATCH in flight as its journal allows, or claim the queued one with a
fresh fencing token and plan it; either way the request it sends passes the send gate
(`services.patch.gate`) in this transaction. The claim spends the budget's daily quota."""

from __future__ import annotations

import dataclasses
import uuid

from db import journal as jq
from db import links as links_q
from db import patches as pq
from db.patches import PatchRow
from db.records import Conn
from protocol.messages import StepResult
from protocol.recovery import Step, next_step
from protocol.send_gate import Refused
from protocol.snapshots import LinkSnapshot
from protocol.states import LinkStatus, PatchStatus
from services.cas import require_cas
from services.evidence import frozen_patch_profile, patch_recovery
from services.link_step import LinkStep, QuotaExhausted, lock_link, quota_wait, settled, spend
from services.patch.gate import (
    frozen_fields,
    gate_patch,
    gate_read_back,
    patch_context,
    refuse_patch,
)
from services.patch.plan import PatchSend, build_patch, precondition
from services.rows import link_snapshot


async def claim_patch(step: LinkStep, key: str) -> PatchSend | StepResult:
    """The claimed PATCH, or what the link is when there is none to send (or the daily
    quota is spent: the claim rolled back and the link waits for the reset)."""
    try:
        async with step.tx(key) as conn:
            await lock_link(conn, key)
            plan = await claim_queued(conn, key)
            if plan is None:
                return await settled(conn, key)
            # The PATCH (or its read-back) spends the daily quota under its claim.
            await spend(step, conn, plan.link.remote_scope, plan.link.profile.credential_ref)
            return plan
    except QuotaExhausted as exhausted:  # the claim rolled back: nothing was written
        return await quota_wait(step, key, exhausted.wait)


async def claim_queued(conn: Conn, key: str) -> PatchSend | None:
    """Under the link lock: resume an in-flight PATCH or claim and build the queued one."""
    row = await links_q.link_by_key(conn, key)
    if row is None or row["status"] != LinkStatus.FINALIZED.value:
        await pq.supersede_queued(conn, key, "link is not finalized")
        return None
    link = link_snapshot(row)
    token = uuid.uuid4()
    guard = precondition(link, row["remote_etag"])
    in_flight = await pq.in_flight_patch(conn, key)
    if in_flight is not None and in_flight.remote_io_started_at is not None:
        plan = await _resume_sent(conn, in_flight, link, token, guard)
    else:
        if in_flight is not None:
            # Its claim was lost before any remote I/O: pending again, retry count +1.
            await pq.release_lost_patch(conn, in_flight.patch_id)
        patch = await pq.pending_patch(conn, key)
        if patch is None or not await pq.claim_patch(conn, patch.patch_id, token):
            return None
        plan = await build_patch(conn, key, link, patch, token, guard)
    if plan is None or not guard or not plan.contract.readback:
        return plan
    earlier = tuple(await pq.ambiguous_bodies_since_etag(conn, key))
    return dataclasses.replace(plan, earlier_bodies=earlier)


async def _resume_sent(
    conn: Conn, patch: PatchRow, link: LinkSnapshot, token: uuid.UUID, guard: dict[str, str]
) -> PatchSend | None:
    """An earlier try passed its fence: the journal decides (REC-4). The same frozen body
    is sent again only if no earlier try can have landed (C-2'), and only through the
    send gate, like a first try; otherwise a declared read-back may prove it applied (C-2:
    a read, never a re-send, through the gate too), else it is ambiguous."""
    contract = frozen_patch_profile(patch, link.profile)
    decision = next_step(await patch_recovery(conn, patch, contract))
    patch_id = patch.patch_id
    match decision.step:
        case Step.SEND | Step.READ_BACK:
            read_only = decision.step is Step.READ_BACK
            refused = await _gate_resume(conn, link, patch, read_only)
            if refused is not None:
                await refuse_patch(conn, link.link_key, patch_id, None, refused)
                return None
            # A re-send's checkpoint and journal row are written at its fence (send.py);
            # a read-back's journal row (kind `readback`) with this claim.
            claimed, journal_id = await jq.claim_patch_for_send(
                conn, patch_id, token, checkpoint=False, readback=read_only
            )
            require_cas(claimed, "claim_patch_for_send")
            assert patch.update_path is not None, "frozen with the body, before any send"
            return PatchSend(
                patch_id,
                token,
                link,
                patch.update_path,
                patch.body,
                None,
                guard,
                contract,
                decision.may_have_landed,
                read_back_only=read_only,
                read_back_journal_id=journal_id,
            )
        case Step.PARK_AMBIGUOUS:
            require_cas(
                await pq.finish_patch(
                    conn, patch_id, PatchStatus.AMBIGUOUS_REMOTE_EFFECT, last_error=decision.reason
                ),
                "finish_patch",
            )
        case Step.TERMINAL:
            require_cas(
                await pq.finish_patch(
                    conn, patch_id, PatchStatus.FAILED, last_error=decision.reason
                ),
                "finish_patch",
            )
        case _:
            pass
    return None


async def _gate_resume(
    conn: Conn, link: LinkSnapshot, patch: PatchRow, read_only: bool
) -> Refused | None:
    """G-1 for the request a resumed PATCH sends: its read-back GET, or the frozen body
    again, checked like a first try with the fields that body carries."""
    if read_only:
        gate = await gate_read_back(conn, link)
    else:
        ctx, _ = await patch_context(conn, link.link_key, link, patch.originating_user_id)
        gate = gate_patch(ctx, link, frozen_fields(patch))
    return gate if isinstance(gate, Refused) else None
