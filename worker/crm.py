"""The CRM-facing entry (SPEC WF-2): report one save, get the admission decision.

Admission is one Postgres transaction in the caller with zero remote I/O; then
the link's workflow is woken with signal-with-start. If Temporal is unreachable
the admission still stands and the relay dispatches it later.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

import asyncpg
from temporalio.client import Client

from activities.admission import admit_save
from activities.wake import wake_link
from protocol.admission import (
    AdmissionDecision,
    CreateReserved,
    DeferredAssociationReserved,
    Rejected,
    SaveRequest,
)
from protocol.errors import RejectReason
from protocol.identity import link_workflow_id

log = logging.getLogger(__name__)

# The CRM-facing names of the shared wake-up (activities.wake holds the logic).
workflow_id = link_workflow_id
__all__ = ["decision_link_key", "report_save", "wake_link", "workflow_id"]


def decision_link_key(decision: AdmissionDecision) -> str | None:
    if isinstance(decision, CreateReserved | DeferredAssociationReserved):
        return decision.reservation.link_key
    return decision.link_key


def _wakes_workflow(decision: AdmissionDecision) -> bool:
    """Work was queued, or a link was just suspended and its workflow must publish it."""
    if isinstance(decision, Rejected):
        return decision.reason is RejectReason.DRIFT_FAIL_CLOSED
    return True


async def report_save(
    pool: asyncpg.Pool,
    client: Client | None,
    task_queue: str,
    save: SaveRequest,
    save_id: str | None = None,
) -> AdmissionDecision:
    """Admit one save and wake its workflow; the decision stands even if waking fails."""
    idempotency_key = str(uuid.uuid4())
    decision = await admit_save(
        pool,
        save,
        idempotency_key=idempotency_key,
        locator_value=f"cp-{idempotency_key}",
        now=datetime.now(UTC),
    )
    key = decision_link_key(decision)
    if key is None or client is None or not _wakes_workflow(decision):
        return decision
    try:
        await wake_link(client, task_queue, key, save_id)
    except Exception:  # Temporal down: the relay signals links with pending work later
        log.warning("could not wake workflow; relay will dispatch", extra={"link_key": key})
    return decision
