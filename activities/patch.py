"""The PATCH path (SPEC PATCH-1..3, PAT, DRIFT-2): update only the object the link owns.

A PATCH is built at dispatch time from the latest record under the latest
saver's current authority, after the before-PATCH gates and the drift
classifier passed against the active pack. Fail-closed drift and remote
404/409 evidence suspend the link; nothing here ever POSTs.

Ambiguous PATCHes: a dispatch whose checkpoint is set and whose outcome is
unknown ends `ambiguous_remote_effect` and is never re-sent (unless the profile
declares PATCH replay-safe). The link stays `finalized` and `NeedsOperator`
stays false: every PATCH carries the full mapped state, so the next save's
PATCH converges the remote object whether or not the ambiguous one landed. The
dispatch stays visible in `links show` (PATCH history) and in the workflow's
details line.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.admission import load_context
from activities.link_base import require_cas
from activities.rows import jsonb, link_snapshot, profile_and_path_columns
from db import links as links_q
from db import patches as pq
from db.records import Conn
from protocol.admission import PatchQueued, Rejected, SaveRequest
from protocol.drift import Finding
from protocol.errors import RejectReason, SuspendReason
from protocol.gates import decide_patch
from protocol.outcome import (
    Observation,
    PatchAmbiguous,
    PatchFailed,
    PatchOutcome,
    PatchRetry,
    PatchSucceeded,
    PatchSuspendLink,
)
from protocol.snapshots import LinkSnapshot
from protocol.states import LinkStatus


@dataclass(frozen=True)
class PatchSend:
    patch_id: uuid.UUID
    token: uuid.UUID
    link: LinkSnapshot
    path: str
    body: Any
    checkpointed: bool
    headers: dict[str, str]


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
        return await _resume_sent(conn, in_flight, link, token, guard)
    patch = in_flight or await pq.pending_patch(conn, key)
    if patch is None or not await pq.claim_patch(conn, patch["patch_id"], token):
        return None
    return await _build(conn, key, link, patch, token, guard)


def precondition(link: LinkSnapshot, etag: str | None) -> dict[str, str]:
    """The profile's declared precondition header with the last seen entity tag (PATCH-3)."""
    header = link.profile.precondition_header
    return {header: etag} if header and etag else {}


async def _resume_sent(
    conn: Conn, patch: Any, link: LinkSnapshot, token: uuid.UUID, guard: dict[str, str]
) -> PatchSend | None:
    """An earlier try may have sent this PATCH: re-send only if declared replay-safe."""
    if not link.profile.patch_replay_safe:
        require_cas(
            await pq.finish_patch(
                conn,
                patch["patch_id"],
                "ambiguous_remote_effect",
                last_error="PATCH may have been sent by an earlier try; not replay-safe",
            ),
            "finish_patch",
        )
        return None
    require_cas(await pq.rotate_patch_token(conn, patch["patch_id"], token), "rotate_patch_token")
    body = jsonb(patch["body"])
    return PatchSend(patch["patch_id"], token, link, patch["update_path"], body, True, guard)


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
        False,
        guard,
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
            conn, key, SuspendReason.DRIFT.value, findings_json(decision.findings)
        )
        await pq.supersede_queued(conn, key, "link suspended: drift")


async def record_outcome(
    conn: Conn, plan: PatchSend, outcome: PatchOutcome, obs: Observation
) -> None:
    """Persist what the remote said (PATCH-3); retryable outcomes raise for Temporal."""
    response = {"status": obs.status, "transport": obs.transport.value}
    key = plan.link.link_key
    match outcome:
        case PatchSucceeded():
            if etag := obs.headers.get("etag"):
                await pq.set_remote_etag(conn, key, etag)
            require_cas(
                await pq.finish_patch(
                    conn, plan.patch_id, "succeeded", token=plan.token, response=response
                ),
                "finish_patch",
            )
        case PatchSuspendLink(reason=reason, status=status):
            require_cas(
                await pq.finish_patch(
                    conn,
                    plan.patch_id,
                    "failed",
                    token=plan.token,
                    last_error=f"remote {status}: {reason.value}",
                    response=response,
                ),
                "finish_patch",
            )
            evidence = [
                {
                    "surface": "remote",
                    "disposition": "fail_closed",
                    "detail": f"PATCH answered {status}",
                }
            ]
            await pq.suspend_link(conn, key, reason.value, evidence)
            await pq.supersede_queued(conn, key, f"link suspended: {reason.value}")
        case PatchFailed(status=status):
            require_cas(
                await pq.finish_patch(
                    conn,
                    plan.patch_id,
                    "failed",
                    token=plan.token,
                    last_error=f"remote rejected the PATCH with {status}",
                    response=response,
                ),
                "finish_patch",
            )
        case PatchAmbiguous(reason=reason):
            require_cas(
                await pq.finish_patch(
                    conn,
                    plan.patch_id,
                    "ambiguous_remote_effect",
                    token=plan.token,
                    last_error=reason,
                    response=response,
                ),
                "finish_patch",
            )
        case PatchRetry(retry_after_seconds=seconds):
            delay = timedelta(seconds=seconds) if seconds is not None else None
            raise ApplicationError(
                "PATCH will be retried", type="PatchRetry", next_retry_delay=delay
            )


def validated_values(active: Any) -> dict[str, Any]:
    """The active install's snapshots a link takes on when drift validation passes."""
    return {
        "last_validated_pack_install_id": active.pack_install_id,
        **active.names().model_dump(mode="json"),
        **profile_and_path_columns(active.profile_snapshot(), active.action_snapshot()),
    }
