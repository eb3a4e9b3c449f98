"""The send journal as the activities read and write it (SPEC JRN-1, REC-4, PROF-1, ID-4).

Shared by the create path, the PATCH path, retry exhaustion and operator actions,
so every one of them decides from the same evidence with `protocol.recovery`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from db import journal as jq
from db import links as q
from db.patches import PatchRow
from db.records import Conn
from protocol.outcome import Observation, body_hash, parse_retry_after, send_outcome
from protocol.recovery import RecoveryInput, SendKind
from protocol.snapshots import ProfileSnapshot
from protocol.states import DispatchLane
from services.cas import require_cas
from services.rows import journal_entries, jsonb

# Retry-After absent: wait this long before re-sending a "not applied" request.
DEFAULT_NOT_APPLIED_DELAY_S = 1.0
MAX_NOT_APPLIED_DELAY_S = 300.0


async def attempt_recovery(
    conn: Conn, attempt: asyncpg.Record, profile: ProfileSnapshot, now: datetime | None = None
) -> RecoveryInput:
    """The create's recovery input, decided at `now` (default: this process's clock), so a
    re-send's key retention can be proven (G-5)."""
    rows = await jq.attempt_journal(conn, str(attempt["attempt_id"]))
    return RecoveryInput(
        now=now or datetime.now(UTC),
        kind=SendKind.CREATE,
        status=attempt["status"],
        journal=journal_entries(rows),
        contract=profile,
        checkpoint_set=attempt["remote_io_started_at"] is not None,
        deferred=attempt["dispatch_lane"] == DispatchLane.DEFERRED_ASSOCIATION.value,
    )


async def patch_recovery(conn: Conn, patch: PatchRow, profile: ProfileSnapshot) -> RecoveryInput:
    rows = await jq.patch_journal(conn, patch.patch_id)
    return RecoveryInput(
        kind=SendKind.PATCH,
        status=patch.status,
        journal=journal_entries(rows),
        contract=profile,
        checkpoint_set=patch.remote_io_started_at is not None,
    )


def frozen_patch_profile(patch: PatchRow, fallback: ProfileSnapshot) -> ProfileSnapshot:
    """The contract frozen with the PATCH body; older rows fall back to the link's."""
    frozen = patch.profile_snapshot
    return ProfileSnapshot.model_validate(frozen) if frozen else fallback


async def record_try(
    conn: Conn,
    journal_id: int | None,
    obs: Observation,
    remote_id: str | None = None,
    daily_refusal: bool = False,
) -> None:
    """Write what the wire showed for one try into its journal row, once (JRN-1), with the
    remote id when the answer was a create that named one; `daily_refusal`: the answer was
    the frozen contract's daily limit (PROF-5, `NotApplied.daily_limit`)."""
    if journal_id is None:
        return  # a read (locator lookup, read-back) has no journal row
    retry_after = parse_retry_after(obs.headers.get("retry-after"), obs.now)
    recorded = await jq.record_outcome(
        conn,
        journal_id,
        send_outcome(obs).value,
        obs.status,
        body_hash(obs.body),
        retry_after,
        remote_id,
        daily_refusal,
    )
    require_cas(recorded, "record_outcome")


def retry_delay(retry_after: float | None, profile: ProfileSnapshot) -> float:
    """How long the workflow waits before re-sending after a "not applied" answer."""
    wanted = DEFAULT_NOT_APPLIED_DELAY_S if retry_after is None else retry_after
    return min(max(wanted, 0.1), MAX_NOT_APPLIED_DELAY_S, profile.not_applied_budget_seconds)


async def owner_of_remote_id(conn: Conn, attempt_id: str, remote_id: str) -> str:
    """Name the link that owns `remote_id` for the attempt's destination (ID-4)."""
    attempt = await q.attempt_by_id(conn, attempt_id)
    assert attempt is not None, "attempts are never deleted"
    scope = jsonb(attempt["request_snapshot"])["remote_scope"]
    owner = await q.locator_owner(
        conn, attempt["connector_owner_key"], attempt["destination_slot_id"], scope, remote_id
    )
    return f"link {owner}" if owner else "another link"
