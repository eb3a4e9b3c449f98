"""The send gate's call on the create path (SPEC §17 G-1, C-5, C-4; seed drift matrix,
"Active create attempt" column): under the claim, before the checkpoint, every request
of a create — the first POST, a re-send, the locator lookup GET — is put to
`protocol.send_gate.decide` with the attempt's frozen snapshot and the owner's active
install. A refusal moves the attempt out of the dispatch with nothing sent: terminal
when no try of it can have landed, else `ambiguous_remote_effect` (C-1).

The active install id comes with the attempt row (`db.links.occupying_attempt`) and
the install's parsed manifest from the process cache, so the common path costs no
statement and no transaction of its own.
"""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

from db import links as q
from db.records import Conn
from protocol.active import ActiveMetadata, resolve_active
from protocol.errors import ActivityErrorType as E
from protocol.recovery import RecoveryInput
from protocol.send_gate import KEY_EXPIRED, GateInput, Go, KeyAge, RequestKind, decide
from protocol.snapshots import CreateRequestSnapshot
from services.cas import require_cas
from services.link_step import StepFailed, view
from services.packs import install_cached
from services.rows import attempt_snapshot, jsonb

log = logging.getLogger(__name__)


def frozen_key_retention(request: CreateRequestSnapshot) -> float | None:
    """G-5: how long the remote honours the frozen request's idempotency key, in seconds,
    as frozen with it. None when the profile declared none: such a request is never
    re-sent on its key (protocol.recovery treats it as retention 0), so there is nothing
    more to check here."""
    retention = request.profile.post_key_retention_seconds
    return float(retention) if retention else None


def key_age(recovery: RecoveryInput, request: CreateRequestSnapshot, now: datetime) -> KeyAge:
    """The key's age, counted from its first try's send (G-5), and its frozen retention."""
    first = next((e.sending_at for e in recovery.journal if e.sending_at is not None), None)
    age = None if first is None else (now - first).total_seconds()
    return KeyAge(age_seconds=age, retention_seconds=frozen_key_retention(request))


async def active_for(conn: Conn, attempt: asyncpg.Record) -> ActiveMetadata | None:
    """The owner's active install as seen from the attempt's stable slot ids."""
    install_id = attempt["active_pack_install_id"]
    pack = None if install_id is None else await install_cached(conn, install_id)
    if pack is None:
        return None
    return resolve_active(
        pack.manifest,
        pack.pack_install_id,
        attempt["action_slot_id"],
        attempt["destination_slot_id"],
        install_ancestors=frozenset(pack.ancestors),
    )


async def gate_create(
    conn: Conn,
    key: str,
    attempt: asyncpg.Record,
    kind: RequestKind,
    landed: int,
    age: KeyAge | None = None,
) -> StepFailed | None:
    """G-1 for one request of the attempt (`landed`: its tries that may have landed).
    The findings are recorded (a statement only when they changed); on a refusal the
    attempt is moved, and the refusal the step raises once it committed is returned."""
    gate = GateInput(
        kind=kind,
        frozen=attempt_snapshot(attempt),
        active=await active_for(conn, attempt),
        key_age=age or KeyAge(),
    )
    decision = decide(gate)
    dumped = [f.model_dump(mode="json") for f in decision.findings]
    if jsonb(attempt["drift_findings"]) != dumped and (dumped or attempt["drift_findings"]):
        await q.record_attempt_drift(conn, str(attempt["attempt_id"]), dumped)
    if isinstance(decision, Go):
        return None
    # A refusal sends nothing; whether an earlier try may have landed decides the state.
    target = "ambiguous_remote_effect" if landed else "terminal_failed"
    moved = await q.move_attempt(
        conn,
        str(attempt["attempt_id"]),
        ["pending", "processing", "post_sent"],
        target,
        last_error=decision.detail,
    )
    require_cas(moved, "move_attempt")
    log.warning(
        "attempt parked %s before its %s: %s",
        target,
        kind.value,
        decision.detail,
        extra={"link_key": key, "attempt_id": str(attempt["attempt_id"])},
    )
    error = E.AMBIGUOUS_REMOTE_EFFECT if decision.reason == KEY_EXPIRED else E.GATE_FAILED
    return StepFailed(error, decision.detail, await view(conn, key))
