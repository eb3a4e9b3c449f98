"""Planning a PATCH (SPEC PATCH-1, PATCH-2, DRIFT-2, §17 G-1): its body built from the
current record under the current authority, after the send gate
(`services.patch.gate`) and the before-PATCH gates passed, and frozen under the claim;
or refused, failing the PATCH (and suspending the link on fail-closed drift)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from db import links as links_q
from db import patches as pq
from db.patches import FrozenPatch, PatchRow
from db.records import Conn
from protocol.admission import PatchQueued, Rejected
from protocol.drift import Finding
from protocol.drift import suspend_reason as drift_suspend_reason
from protocol.errors import RejectReason
from protocol.gates import decide_patch
from protocol.send_gate import Refused
from protocol.snapshots import LinkSnapshot, ProfileSnapshot
from protocol.states import LinkStatus, PatchStatus
from services.cas import require_cas
from services.patch.gate import gate_patch, patch_context, refuse_patch
from services.rows import profile_and_path_columns


@dataclass(frozen=True)
class PatchSend:
    """A claimed PATCH, ready for its send (or, `read_back_only`, for its read-back)."""

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
    # The read-back's journal row (kind `readback`), written by the claim that gated it.
    read_back_journal_id: int | None = None


def findings_json(findings: tuple[Finding, ...] | list[Finding]) -> list[dict[str, Any]]:
    return [f.model_dump(mode="json") for f in findings]


def precondition(link: LinkSnapshot, etag: str | None) -> dict[str, str]:
    """The profile's declared precondition header with the last seen entity tag (PATCH-3)."""
    header = link.profile.precondition_header
    return {header: etag} if header and etag else {}


async def build_patch(
    conn: Conn,
    key: str,
    link: LinkSnapshot,
    patch: PatchRow,
    token: uuid.UUID,
    guard: dict[str, str],
) -> PatchSend | None:
    """Under the claim `token`: gate the queued PATCH (G-1) and freeze its body, or
    refuse it; nothing is sent on a refusal."""
    ctx, active = await patch_context(conn, key, link, patch.originating_user_id)
    gate = gate_patch(ctx, link, frozenset())  # the body is built below, under the gate
    if isinstance(gate, Refused):
        await refuse_patch(conn, key, patch.patch_id, token, gate)
        return None
    decision = decide_patch(ctx)
    if isinstance(decision, Rejected):
        await _refuse(conn, key, patch.patch_id, token, decision)
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
            patch.patch_id,
            token,
            FrozenPatch(
                body=decision.request.body,
                body_fingerprint=decision.request.body_hash,
                update_path=decision.request.relative_path,
                authority_snapshot=decision.authority.model_dump(mode="json"),
                profile_snapshot=link.profile.model_dump(mode="json"),
            ),
        ),
        "freeze_patch",
    )
    return PatchSend(
        patch.patch_id,
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
        await pq.finish_patch(conn, patch_id, PatchStatus.FAILED, token=token, last_error=reason),
        "finish_patch",
    )
    if decision.reason is RejectReason.DRIFT_FAIL_CLOSED:
        await pq.suspend_link(
            conn, key, drift_suspend_reason(decision.findings), findings_json(decision.findings)
        )
        await pq.supersede_queued(conn, key, "link suspended: drift")


def validated_values(active: Any) -> dict[str, Any]:
    """The active install's snapshots a link takes on when drift validation passes."""
    return {
        "last_validated_pack_install_id": active.pack_install_id,
        **active.names().model_dump(mode="json"),
        **profile_and_path_columns(active.profile_snapshot(), active.action_snapshot()),
    }
