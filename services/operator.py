"""Operator actions (SPEC WF-3), applied under the link lock with compare-and-set.

Every action is re-checked here with `protocol.operator` against the rows just
read, so a stale workflow view can never apply an illegal move; every action
stamps who, when and why on the row it changed.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import JsonValue
from temporalio.exceptions import ApplicationError

from db import audit as audit_q
from db import links as q
from db import patches as pq
from db import remote_deletions as deletions_q
from db.errors import RemoteLocatorClaimedError
from db.records import Conn
from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import CreateReserved, DeferredAssociationReserved, SaveRequest
from protocol.audit import OPERATOR_ACTION_COMMANDS, AuditEntry
from protocol.drift import Disposition, classify
from protocol.drift import suspend_reason as drift_suspend_reason
from protocol.errors import ActivityErrorType, SuspendReason
from protocol.messages import LinkView, OperatorActionInput
from protocol.operator import OperatorAction, check_operator_action
from protocol.recovery import Decision, Step, next_step
from protocol.remote_deletion import deleted_object_refusal
from protocol.remote_ids import RemoteIdError, check_remote_id
from protocol.restore_rule import RestorePath, refusal
from protocol.states import LinkStatus, PatchStatus, ProtocolError
from services.admission import admit_locked
from services.cas import require_cas
from services.evidence import (
    attempt_recovery,
    frozen_patch_profile,
    owner_of_remote_id,
    patch_recovery,
)
from services.mirror import finalize_with_mirror
from services.packs import get_active_pack
from services.patch.plan import validated_values
from services.rows import attempt_snapshot, jsonb, link_snapshot, request_of

ViewFn = Callable[[Conn, str], Awaitable[LinkView]]


@dataclass(frozen=True)
class ReadBackEtag:
    """What revalidating a `remote_conflict` link read back (PROF-2)."""

    etag: str | None
    read: bool  # False: the profile declares no read-back; the stale tag is dropped


Refresh = ReadBackEtag | None


def _refuse(message: str) -> ApplicationError:
    return ApplicationError(
        message, type=ActivityErrorType.TRANSITION_CONFLICT.value, non_retryable=True
    )


async def apply_operator_action(
    conn: Conn,
    input: OperatorActionInput,
    view_of: ViewFn,
    refresh: Refresh = None,
    temporal_identity: str | None = None,
) -> str:
    """Apply `input` in the caller's transaction; raise a non-retryable refusal otherwise.

    The action, its stamp on the link (`last_operator`, whichever row it moved) and
    its audit entry (OPS-2) commit together or not at all.
    """
    view = await view_of(conn, input.link_key)
    action = OperatorAction(input.action)
    try:
        check_operator_action(action, view)
    except ProtocolError as error:
        raise _refuse(str(error)) from error
    message = await _apply(conn, action, input, view, refresh)
    await q.record_operator(
        conn, "connector_remote_link", "link_key", input.link_key, input.operator, input.reason
    )
    after = await view_of(conn, input.link_key)
    await audit_q.append(conn, _audit_entry(input, view, after, message, temporal_identity))
    return message


def _audit_entry(
    input: OperatorActionInput, before: LinkView, after: LinkView, message: str, who: str | None
) -> AuditEntry:
    arguments = input.model_dump(
        mode="json", include={"remote_id", "evidence", "reserve_next", "new_idempotency_key"}
    )
    return AuditEntry(
        operator=input.operator,
        reason=input.reason,
        command=OPERATOR_ACTION_COMMANDS[input.action],
        link_key=input.link_key,
        arguments={k: v for k, v in arguments.items() if v not in (None, False)},
        state_before=_audited_state(before),
        state_after=_audited_state(after),
        outcome=message,
        temporal_identity=who,  # S-5: the update's client, beside the declared operator
    )


def _audited_state(view: LinkView) -> dict[str, JsonValue]:
    return view.model_dump(
        mode="json",
        include={
            "link_status",
            "remote_id",
            "suspend_reason",
            "attempt_id",
            "attempt_status",
            "attempt_ordinal",
        },
    )


async def _apply(
    conn: Conn,
    action: OperatorAction,
    input: OperatorActionInput,
    view: LinkView,
    refresh: Refresh,
) -> str:
    match action:
        case OperatorAction.SUPERSEDE:
            return await _supersede(conn, input, view)
        case OperatorAction.RECONCILE:
            return await _reconcile(conn, input, view)
        case OperatorAction.RETIRE:
            assert view.link_status is not None
            require_cas(
                await q.move_link(conn, input.link_key, [view.link_status.value], "retired"),
                "move_link",
            )
            return "link retired"
        case OperatorAction.MARK_TERMINAL:
            assert view.attempt_id is not None
            require_cas(
                await q.move_attempt(
                    conn,
                    view.attempt_id,
                    ["pending"],
                    "terminal_failed",
                    last_error=f"marked terminal by {input.operator}",
                ),
                "move_attempt",
            )
            await _stamp_attempt(conn, view.attempt_id, input)
            return "attempt marked terminal_failed"
        case OperatorAction.REVALIDATE:
            return await _revalidate(conn, input, refresh)


async def _stamp_attempt(conn: Conn, attempt_id: str, input: OperatorActionInput) -> None:
    await q.record_operator(
        conn,
        "connector_push_attempt",
        "attempt_id",
        uuid.UUID(attempt_id),
        input.operator,
        input.reason,
    )


async def _supersede(conn: Conn, input: OperatorActionInput, view: LinkView) -> str:
    assert view.attempt_id is not None
    old = await q.attempt_by_id(conn, view.attempt_id)
    assert old is not None
    require_cas(await q.supersede_attempt(conn, view.attempt_id, None), "supersede_attempt")
    await _stamp_attempt(conn, view.attempt_id, input)
    if not input.reserve_next:
        return "attempt superseded"
    key = input.new_idempotency_key or str(uuid.uuid4())
    save = SaveRequest(
        connector_owner_key=old["connector_owner_key"],
        action_slot_id=old["action_slot_id"],
        destination_slot_id=old["destination_slot_id"],
        source_object=old["source_object"],
        source_record_id=old["source_record_id"],
        originating_user_id=jsonb(old["authority_snapshot"])["originating_user_id"],
    )
    decision = await admit_locked(conn, input.link_key, save, key, f"cp-{key}", input.accepted_at)
    if not isinstance(decision, CreateReserved | DeferredAssociationReserved):
        reason = getattr(decision, "reason", decision.kind)
        # Raised inside the transaction: the supersede itself rolls back too.
        refused = f"not superseded: the next attempt would be refused ({reason}); nothing changed"
        raise _refuse(refused)
    new = await q.occupying_attempt(conn, input.link_key)
    assert new is not None
    await q.set_superseded_by(conn, view.attempt_id, new["attempt_id"])
    return f"attempt superseded; attempt #{new['attempt_ordinal']} reserved"


async def _reconcile(conn: Conn, input: OperatorActionInput, view: LinkView) -> str:
    assert view.attempt_id is not None and input.remote_id is not None
    await _check_reconcile_id(conn, view.attempt_id, input.remote_id)
    active = await _check_reconcile_slots(conn, view.attempt_id)
    await _refuse_deleted_object(conn, view.attempt_id, input.remote_id)
    response = {
        "status": None,
        "remote_id": input.remote_id,
        "reconciled_by": input.operator,
        "evidence": input.evidence,
    }
    try:
        async with conn.transaction():  # a savepoint: ID-4 refusal leaves the attempt parked
            await finalize_with_mirror(
                conn,
                view.attempt_id,
                None,
                input.remote_id,
                response,
                expected=("ambiguous_remote_effect",),
            )
            suspended = await _suspend_if_drifted(conn, input.link_key, active)
    except RemoteLocatorClaimedError as error:
        owner = await owner_of_remote_id(conn, view.attempt_id, input.remote_id)
        refused = f"not reconciled: remote id {input.remote_id} is already linked to {owner}"
        raise _refuse(refused + "; nothing changed") from error
    await _stamp_attempt(conn, view.attempt_id, input)
    done = f"reconciled to remote id {input.remote_id}"
    if suspended is None:
        return done
    return (
        f"{done}; the link is suspended ({suspended}): the active pack fails it closed "
        f"(G-4), so check the change, then `revalidate-link {input.link_key}` or retire it"
    )


async def _suspend_if_drifted(conn: Conn, link_key: str, active: ActiveMetadata) -> str | None:
    """G-4 with G-6: reconcile is an ambiguous attempt's one exit, so a link the active
    pack fails closed (any finding but a removed slot, refused before) is still born, but
    never left `finalized`: it is suspended in the same transaction with its findings, as
    a save would suspend it (DRIFT-2). The suspend reason, or None when it stays."""
    row = await q.link_by_key(conn, link_key)
    assert row is not None, "finalize_with_mirror inserted it"
    if row["status"] == LinkStatus.SUSPENDED_DRIFT:  # born suspended: its slot is gone
        return str(row["suspend_reason"])
    closed = [
        f for f in classify(link_snapshot(row), active) if f.disposition is Disposition.FAIL_CLOSED
    ]
    if not closed:
        return None
    reason = drift_suspend_reason(closed)
    require_cas(
        await pq.suspend_link(conn, link_key, reason, [f.model_dump(mode="json") for f in closed]),
        "suspend_link",
    )
    return reason


async def _check_reconcile_id(conn: Conn, attempt_id: str, remote_id: str) -> None:
    """PROF-4: only a canonical remote id is stored; the refusal names who owns the id
    the operator probably meant, instead of raw Postgres text."""
    attempt = await q.attempt_by_id(conn, attempt_id)
    assert attempt is not None, "attempts are never deleted"
    try:
        check_remote_id(remote_id, request_of(attempt).profile.remote_id_pattern)
    except RemoteIdError as error:
        owned = ""
        if error.canonical is not None:
            owner = await owner_of_remote_id(conn, attempt_id, error.canonical)
            if owner != "another link":
                owned = f"; {error.canonical!r} is already linked to {owner}"
        raise _refuse(f"not reconciled: {error}{owned}; nothing changed") from error


async def _refuse_deleted_object(conn: Conn, attempt_id: str, remote_id: str) -> None:
    """G-8: a remote object reported deleted (in whatever state the link was then) is not
    the object a parked create made, as far as reconcile can prove: finalizing the link
    to it would PATCH a deleted object."""
    attempt = await q.attempt_by_id(conn, attempt_id)
    assert attempt is not None, "attempts are never deleted"
    request = request_of(attempt)
    deleted = await deletions_q.of_object(
        conn, request.target_object, remote_id, request.remote_scope
    )
    if deleted:
        raise _refuse(deleted_object_refusal("reconciled", deleted[0]))


async def _check_reconcile_slots(conn: Conn, attempt_id: str) -> ActiveMetadata:
    """G-4: reconcile never finalizes a link under a slot the active pack lacks (C-9); the
    attempt stays parked with its evidence. Nothing is written before this check. The
    active pack resolved for the attempt's slots."""
    attempt = await q.attempt_by_id(conn, attempt_id)
    assert attempt is not None, "attempts are never deleted"
    frozen = attempt_snapshot(attempt)
    pack = await get_active_pack(conn, frozen.slot.connector_owner_key)
    if pack is None:
        raise _refuse(f"no active pack for owner {frozen.slot.connector_owner_key!r}")
    slot = frozen.slot
    active = resolve_active(
        pack.manifest, pack.pack_install_id, slot.action_slot_id, slot.destination_slot_id
    )
    refused = refusal(frozen, active, RestorePath.RECONCILE)
    if refused is not None:
        raise _refuse(f"not reconciled: {refused.message()}; nothing changed")
    return active


async def _revalidate(conn: Conn, input: OperatorActionInput, refresh: Refresh) -> str:
    """suspended_drift -> finalized on the active install's snapshots (WF-3).

    Mapping and body fingerprints do not move here (REV-1): a mapping change
    still fails the next PATCH until `revalidate apply` (§9) moves them.
    """
    row = await q.link_by_key(conn, input.link_key)
    assert row is not None
    deleted = await deletions_q.of_object(
        conn, row["target_object"], row["remote_id"], row["remote_scope"]
    )
    if deleted:  # G-8: reported deleted while the link was suspended; finalizing would PATCH it
        raise _refuse(deleted_object_refusal("revalidated", deleted[0]))
    pack = await get_active_pack(conn, row["connector_owner_key"])
    if pack is None:
        raise _refuse(f"no active pack for owner {row['connector_owner_key']!r}")
    active = resolve_active(
        pack.manifest, pack.pack_install_id, row["action_slot_id"], row["destination_slot_id"]
    )
    refused = refusal(link_snapshot(row), active, RestorePath.REVALIDATE_LINK)
    if refused is not None:
        raise _refuse(refused.message())
    restored = {
        "status": LinkStatus.FINALIZED.value,
        "suspend_reason": None,
        "drift_findings": [],
        **validated_values(active),
    }
    suspended = LinkStatus.SUSPENDED_DRIFT.value
    if not await q.update_link_snapshot(conn, input.link_key, suspended, restored):
        raise _refuse("link is no longer suspended")
    message = f"link revalidated against install {pack.pack_install_id}"
    if refresh is not None and row["suspend_reason"] == SuspendReason.REMOTE_CONFLICT.value:
        # PROF-2: the entity tag of the object the operator accepted, so the next PATCH
        # is not refused for the same out-of-band change again.
        await pq.set_remote_etag(conn, input.link_key, refresh.etag)
        shown = refresh.etag if refresh.read else "dropped (no read-back declared)"
        message += f"; entity tag {shown}"
    return message


async def park_in_flight(conn: Conn, link_key: str, error: str) -> None:
    """REC-3, REC-4: an attempt or PATCH whose retries ran out is parked, durably and
    visibly: ambiguous when any try may have landed, terminal/failed only when none did."""
    attempt = await q.occupying_attempt(conn, link_key)
    if (
        attempt is not None
        and attempt["status"] in ("pending", "processing", "post_sent")
        # LANE-1: a row in a lane this runtime does not claim is never normalised.
        and attempt["dispatch_lane"] in q.CLAIMABLE_LANES
    ):
        profile = request_of(attempt).profile
        recovery = await attempt_recovery(conn, attempt, profile)
        decision = next_step(recovery.model_copy(update={"exhausted": True}))
        ambiguous = decision.step is Step.PARK_AMBIGUOUS
        require_cas(
            await q.move_attempt(
                conn,
                str(attempt["attempt_id"]),
                [attempt["status"]],
                "ambiguous_remote_effect" if ambiguous else "terminal_failed",
                last_error=_exhausted_message(decision, error),
            ),
            "move_attempt",
        )
    patch = await pq.in_flight_patch(conn, link_key)
    if patch is not None:
        row = await q.link_by_key(conn, link_key)
        assert row is not None, "links are never deleted"
        contract = frozen_patch_profile(patch, link_snapshot(row).profile)
        recovery = await patch_recovery(conn, patch, contract)
        decision = next_step(recovery.model_copy(update={"exhausted": True}))
        parked = decision.step is Step.PARK_AMBIGUOUS
        target = PatchStatus.AMBIGUOUS_REMOTE_EFFECT if parked else PatchStatus.FAILED
        message = _exhausted_message(decision, error)
        require_cas(
            await pq.finish_patch(conn, patch.patch_id, target, last_error=message),
            "finish_patch",
        )


def _exhausted_message(decision: Decision, error: str) -> str:
    # The last error may describe only the last try ("not sent"): when an earlier try may
    # have landed, the decision's reason is the whole story and nothing else is said.
    if decision.step is Step.PARK_AMBIGUOUS:
        return decision.reason
    return f"{decision.reason} (last error: {error})"
