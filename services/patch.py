"""The PATCH path (SPEC PATCH-1..3, PAT, DRIFT-2): update only the object the link owns.

A PATCH is built at dispatch time from the latest record under the latest
saver's current authority, after the before-PATCH gates and the drift
classifier passed against the active pack. Fail-closed drift and remote
404/409 evidence suspend the link; nothing here ever POSTs.

Ambiguous PATCHes: a dispatch one of whose tries may have landed (its send
journal, `protocol.recovery`) is never sent again, replay-safe profile or not
(SPEC §15 C-2). A profile that declares a read-back may prove it applied with a
GET (the object holds the frozen body: `succeeded`, new ETag stored); otherwise,
or when the read differs, it ends `ambiguous_remote_effect`. The link stays
`finalized` and `NeedsOperator` stays false: every PATCH carries the full
mapped state, so the next save's PATCH converges the remote object whether or
not the ambiguous one landed. The dispatch stays visible in `links show`
(PATCH history and send journal) and in the workflow's details line.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.exceptions import ApplicationError

from db import journal as jq
from db import links as links_q
from db import patches as pq
from db.records import Conn
from protocol.admission import PatchQueued, Rejected, SaveRequest
from protocol.drift import Finding
from protocol.drift import suspend_reason as drift_suspend_reason
from protocol.errors import RejectReason, SuspendReason
from protocol.gates import decide_patch
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
from protocol.snapshots import LinkSnapshot, ProfileSnapshot
from protocol.states import LinkStatus
from services.admission import load_context
from services.cas import require_cas
from services.evidence import frozen_patch_profile, patch_recovery, record_try, retry_delay
from services.rows import jsonb, link_snapshot, profile_and_path_columns


@dataclass(frozen=True)
class PatchSend:
    patch_id: uuid.UUID
    token: uuid.UUID
    link: LinkSnapshot
    path: str
    body: Any
    journal_id: int | None  # set when the claim wrote the checkpoint and its journal row
    headers: dict[str, str]
    contract: ProfileSnapshot  # frozen with the body (PROF-1, PROF-2)
    earlier_may_have_landed: int = 0  # tries before this one that may have reached the remote
    # Bodies of this link's earlier PATCHes that may have landed since the stored entity
    # tag was read (ambiguous ones): a 412 may be their doing, not someone else's (PROF-2).
    earlier_bodies: tuple[Any, ...] = ()
    # C-2: an earlier try may have landed; only a read-back GET may settle it, never a send.
    read_back_only: bool = False


def findings_json(findings: tuple[Finding, ...] | list[Finding]) -> list[dict[str, Any]]:
    return [f.model_dump(mode="json") for f in findings]


async def plan_patch(conn: Conn, key: str) -> PatchSend | None:
    """Under the link lock: resume an in-flight PATCH or claim and build the queued one."""
    row = await links_q.link_by_key(conn, key)
    if row is None or row["status"] != LinkStatus.FINALIZED.value:
        await pq.supersede_queued(conn, key, "link is not finalized")
        return None
    link = link_snapshot(row)
    token = uuid.uuid4()
    guard = precondition(link, row["remote_etag"])
    in_flight = await pq.in_flight_patch(conn, key)
    if in_flight is not None and in_flight["remote_io_started_at"] is not None:
        plan = await _resume_sent(conn, in_flight, link, token, guard)
    else:
        if in_flight is not None:
            # Its claim was lost before any remote I/O: pending again, retry count +1.
            await pq.release_lost_patch(conn, in_flight["patch_id"])
        patch = await pq.pending_patch(conn, key)
        if patch is None or not await pq.claim_patch(conn, patch["patch_id"], token):
            return None
        plan = await _build(conn, key, link, patch, token, guard)
    if plan is None or not guard or not plan.contract.readback:
        return plan
    earlier = tuple(jsonb(b) for b in await pq.ambiguous_bodies_since_etag(conn, key))
    return dataclasses.replace(plan, earlier_bodies=earlier)


def precondition(link: LinkSnapshot, etag: str | None) -> dict[str, str]:
    """The profile's declared precondition header with the last seen entity tag (PATCH-3)."""
    header = link.profile.precondition_header
    return {header: etag} if header and etag else {}


async def _resume_sent(
    conn: Conn, patch: Any, link: LinkSnapshot, token: uuid.UUID, guard: dict[str, str]
) -> PatchSend | None:
    """An earlier try passed its fence: the journal decides (REC-4). The same frozen body
    is sent again only if no earlier try can have landed; otherwise a declared read-back
    may prove it applied (C-2: a read, never a re-send), else it is ambiguous."""
    contract = frozen_patch_profile(patch, link.profile)
    decision = next_step(await patch_recovery(conn, patch, contract))
    patch_id = patch["patch_id"]
    match decision.step:
        case Step.SEND | Step.READ_BACK:
            read_only = decision.step is Step.READ_BACK
            # A read writes no checkpoint and no journal row: nothing is sent.
            claimed, journal_id = await jq.claim_patch_for_send(
                conn, patch_id, token, checkpoint=False
            )
            require_cas(claimed, "claim_patch_for_send")
            body = jsonb(patch["body"])
            path = patch["update_path"]
            landed = decision.may_have_landed
            return PatchSend(
                patch_id,
                token,
                link,
                path,
                body,
                journal_id,
                guard,
                contract,
                landed,
                read_back_only=read_only,
            )
        case Step.PARK_AMBIGUOUS:
            require_cas(
                await pq.finish_patch(
                    conn, patch_id, "ambiguous_remote_effect", last_error=decision.reason
                ),
                "finish_patch",
            )
        case Step.TERMINAL:
            require_cas(
                await pq.finish_patch(conn, patch_id, "failed", last_error=decision.reason),
                "finish_patch",
            )
        case _:
            pass
    return None


async def _build(
    conn: Conn, key: str, link: LinkSnapshot, patch: Any, token: uuid.UUID, guard: dict[str, str]
) -> PatchSend | None:
    save = SaveRequest(
        connector_owner_key=link.slot.connector_owner_key,
        action_slot_id=link.slot.action_slot_id,
        destination_slot_id=link.slot.destination_slot_id,
        source_object=link.slot.source_object,
        source_record_id=link.source_record_id,
        originating_user_id=patch["originating_user_id"],
    )
    ctx, active = await load_context(conn, key, save, now=datetime.now(UTC))
    decision = decide_patch(ctx)
    if isinstance(decision, Rejected):
        await _refuse(conn, key, patch["patch_id"], token, decision)
        return None
    assert isinstance(decision, PatchQueued)
    if decision.findings and active is not None:
        # Benign drift: recorded, and the link's validated snapshot moves to the active
        # install (mapping and body fingerprints never move here, REV-1).
        values = {"drift_findings": findings_json(decision.findings), **validated_values(active)}
        await links_q.update_link_snapshot(conn, key, LinkStatus.FINALIZED.value, values)
    require_cas(
        await pq.freeze_patch(
            conn,
            patch["patch_id"],
            token,
            {
                "body": decision.request.body,
                "body_fingerprint": decision.request.body_hash,
                "update_path": decision.request.relative_path,
                "authority_snapshot": decision.authority.model_dump(mode="json"),
                "profile_snapshot": link.profile.model_dump(mode="json"),
            },
        ),
        "freeze_patch",
    )
    return PatchSend(
        patch["patch_id"],
        token,
        link,
        decision.request.relative_path,
        decision.request.body,
        None,
        guard,
        link.profile,
    )


async def _refuse(
    conn: Conn, key: str, patch_id: uuid.UUID, token: uuid.UUID, decision: Rejected
) -> None:
    """PATCH-1 refused: drift suspends the link (DRIFT-2); other reasons fail this PATCH."""
    reason = f"{decision.reason.value}: {decision.detail}".rstrip(": ")
    require_cas(
        await pq.finish_patch(conn, patch_id, "failed", token=token, last_error=reason),
        "finish_patch",
    )
    if decision.reason is RejectReason.DRIFT_FAIL_CLOSED:
        await pq.suspend_link(
            conn, key, drift_suspend_reason(decision.findings), findings_json(decision.findings)
        )
        await pq.supersede_queued(conn, key, "link suspended: drift")


async def record_outcome(
    conn: Conn, plan: PatchSend, journal_id: int | None, outcome: PatchOutcome, obs: Observation
) -> StepResultHint:
    """Persist what the remote said (PATCH-3) with this try's journal outcome, in the
    caller's transaction; see `StepResultHint` for what the caller does next."""
    await record_try(conn, journal_id, obs)
    response = {"status": obs.status, "transport": obs.transport.value}
    match outcome:
        case PatchSucceeded(etag=read_etag):
            if etag := read_etag or obs.headers.get("etag"):
                await pq.set_remote_etag(conn, plan.link.link_key, etag)
            await _finish(conn, plan, "succeeded", None, response)
        case PatchSuspendLink(reason=reason, status=status):
            await _finish(conn, plan, "failed", f"remote {status}: {reason.value}", response)
            await _suspend(conn, plan.link.link_key, reason, f"PATCH answered {status}")
        case PatchEtagMoved(etag=etag):
            # Our own earlier PATCH moved the tag: keep the new one; the same frozen body
            # goes again (this try's 412 proves it was not applied).
            if etag:
                await pq.set_remote_etag(conn, plan.link.link_key, etag)
            return ApplicationError(
                "entity tag moved by an earlier PATCH of ours; re-sending", type="PatchRetry"
            )
        case PatchConflict(status=status):
            # A conflict the read-back did not resolve (or no read-back declared).
            reason = SuspendReason.REMOTE_CONFLICT
            await _finish(conn, plan, "failed", f"remote {status}: {reason.value}", response)
            await _suspend(conn, plan.link.link_key, reason, f"PATCH answered {status}")
        case PatchFailed(status=status):
            message = f"remote rejected the PATCH with {status}"
            await _finish(conn, plan, "failed", message, response)
        case PatchAmbiguous(reason=reason):
            await _finish(conn, plan, "ambiguous_remote_effect", reason, response)
        case NotApplied(retry_after_seconds=seconds):
            return await _not_applied(conn, plan, seconds, obs)
        case PatchRetry(retry_after_seconds=seconds):
            # Returned, not raised: this try's journal outcome must commit first.
            delay = timedelta(seconds=seconds) if seconds is not None else None
            return ApplicationError(
                "PATCH will be retried", type="PatchRetry", next_retry_delay=delay
            )
    return None


# What the caller does after the outcome committed: wait this many seconds (a "not
# applied" answer, in a workflow timer), raise for a Temporal retry, or nothing.
StepResultHint = float | ApplicationError | None


async def _not_applied(
    conn: Conn, plan: PatchSend, retry_after: float | None, obs: Observation
) -> StepResultHint:
    patch = await pq.patch_by_id(conn, plan.patch_id)
    assert patch is not None, "unfinished PATCHes are never deleted"
    recovery = await patch_recovery(conn, patch, plan.contract)
    decision = next_step(recovery.model_copy(update={"now": obs.now}))
    if decision.step is Step.PARK_AMBIGUOUS:
        await _finish(conn, plan, "ambiguous_remote_effect", decision.reason, None)
    elif decision.step is Step.TERMINAL:
        await _finish(conn, plan, "failed", decision.reason, None)
    else:
        return retry_delay(retry_after, plan.contract)
    return None


async def _finish(
    conn: Conn, plan: PatchSend, target: str, error: str | None, response: dict[str, Any] | None
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


def validated_values(active: Any) -> dict[str, Any]:
    """The active install's snapshots a link takes on when drift validation passes."""
    return {
        "last_validated_pack_install_id": active.pack_install_id,
        **active.names().model_dump(mode="json"),
        **profile_and_path_columns(active.profile_snapshot(), active.action_snapshot()),
    }
