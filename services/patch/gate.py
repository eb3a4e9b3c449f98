"""The send gate's call on the PATCH path (SPEC §17 G-1, C-2', C-4, DRIFT-2, PATCH-1): a
PATCH — its first try and every re-send alike — and a read-back GET are put to
`protocol.send_gate.decide` in the transaction that claims or checkpoints them, with
the link's validated snapshot and the configuration as it is now. A refused PATCH
fails, and the link is suspended as the matrix says (a queued later save carries the
new state); a refused read-back parks the PATCH. Nothing is sent either way.

A PATCH's facts (the active install, the record, its saver's authority) come from
the one load its planning makes anyway (`services.admission.load_context`), so a
first try costs no statement more; a re-send loads them the same way.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from db import patches as pq
from db.patches import PatchRow
from db.records import Conn
from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import AdmissionContext, SaveRequest
from protocol.drift import fails_closed, suspend_reason
from protocol.send_gate import Decision, GateInput, Refusal, Refused, RequestKind, SourceNow, decide
from protocol.snapshots import AuthoritySnapshot, LinkSnapshot
from protocol.states import PatchStatus
from services.admission import load_context
from services.cas import require_cas
from services.packs import get_active_pack


def findings_json(refused: Refused) -> list[dict[str, Any]]:
    return [f.model_dump(mode="json") for f in refused.findings]


async def patch_context(
    conn: Conn, key: str, link: LinkSnapshot, user: str | None
) -> tuple[AdmissionContext, ActiveMetadata | None]:
    """Everything PATCH-1 and the gate read, for the PATCH's saver `user`."""
    save = SaveRequest(
        connector_owner_key=link.slot.connector_owner_key,
        action_slot_id=link.slot.action_slot_id,
        destination_slot_id=link.slot.destination_slot_id,
        source_object=link.slot.source_object,
        source_record_id=link.source_record_id,
        originating_user_id=user,
    )
    return await load_context(conn, key, save, now=datetime.now(UTC))


def gate_patch(ctx: AdmissionContext, link: LinkSnapshot, fields_sent: frozenset[str]) -> Decision:
    """G-1 for a PATCH whose body carries `fields_sent` (empty: built now, under the
    current authority, once the gate passed)."""
    source = SourceNow(
        exists=ctx.record.exists,
        deleted=ctx.record.deleted,
        permissions=ctx.permissions,
        fields_sent=fields_sent,
    )
    frozen = ctx.link or link
    return decide(
        GateInput(kind=RequestKind.PATCH, frozen=frozen, active=ctx.active, source=source)
    )


def frozen_fields(patch: PatchRow) -> frozenset[str]:
    """The source fields a frozen PATCH body was built from (its authority snapshot)."""
    frozen = patch.authority_snapshot
    if not frozen:
        return frozenset()
    return frozenset(AuthoritySnapshot.model_validate(frozen).allowed_fields)


async def refuse_patch(
    conn: Conn, key: str, patch_id: uuid.UUID, token: uuid.UUID | None, refused: Refused
) -> None:
    """Nothing is sent: the PATCH fails (or, a refused read-back, parks) and the link is
    suspended when the matrix's finalized-link column fails closed (DRIFT-2)."""
    target = (
        PatchStatus.AMBIGUOUS_REMOTE_EFFECT
        if refused.refusal is Refusal.PARK
        else PatchStatus.FAILED
    )
    require_cas(
        await pq.finish_patch(
            conn, patch_id, target, token=token, last_error=f"{refused.reason}: {refused.detail}"
        ),
        "finish_patch",
    )
    if refused.refusal is Refusal.FAIL_PATCH or not fails_closed(list(refused.findings)):
        return
    # The link's reason: its first fail-closed finding (for a GET, of every finding).
    await pq.suspend_link(conn, key, suspend_reason(refused.findings), findings_json(refused))
    await pq.supersede_queued(conn, key, "link suspended: drift")


async def active_for_link(conn: Conn, link: LinkSnapshot) -> ActiveMetadata | None:
    """The owner's active install as seen from the link's stable slot ids."""
    pack = await get_active_pack(conn, link.slot.connector_owner_key)
    if pack is None:
        return None
    return resolve_active(
        pack.manifest,
        pack.pack_install_id,
        link.slot.action_slot_id,
        link.slot.destination_slot_id,
        install_ancestors=frozenset(pack.ancestors),
    )


async def gate_read_back(conn: Conn, link: LinkSnapshot) -> Decision:
    """G-1 for the GET of the linked object: where it goes and who sends it."""
    active = await active_for_link(conn, link)
    return decide(GateInput(kind=RequestKind.READBACK, frozen=link, active=active))
