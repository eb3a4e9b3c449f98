"""The CRM-facing entry (SPEC WF-2, API-2): report one save, get the admission decision.

Admission is one Postgres transaction in the caller with zero remote I/O; then
the link's workflow is woken with signal-with-start, best effort and bounded in
time. If Temporal is unreachable the admission still stands and the relay
dispatches it later.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from temporalio.client import Client

from protocol.admission import AdmissionDecision, SaveRequest
from protocol.identity import link_workflow_id
from services.save_entry import (
    WAKE_TIMEOUT_S,
    WakeStatus,
    admit_one,
    decision_link_key,
    wake_best_effort,
)
from services.wake import wake_link

# The CRM-facing names of the shared wake-up (services.wake holds the logic).
workflow_id = link_workflow_id
__all__ = [
    "SaveOutcome",
    "WakeStatus",
    "decision_link_key",
    "report_save",
    "report_save_outcome",
    "wake_best_effort",
    "wake_link",
    "workflow_id",
]


@dataclass(frozen=True)
class SaveOutcome:
    decision: AdmissionDecision
    wake: WakeStatus


async def report_save_outcome(
    pool: asyncpg.Pool,
    client: Client | None,
    task_queue: str,
    save: SaveRequest,
    save_id: str | None = None,
    wake_timeout_s: float = WAKE_TIMEOUT_S,
) -> SaveOutcome:
    """Admit one save, then try to wake its workflow; says whether the wake-up happened."""
    decision = await admit_one(pool, save)
    wake = await wake_best_effort(
        client, task_queue, decision, save_id, wake_timeout_s, pool=pool, save=save
    )
    return SaveOutcome(decision, wake)


async def report_save(
    pool: asyncpg.Pool,
    client: Client | None,
    task_queue: str,
    save: SaveRequest,
    save_id: str | None = None,
) -> AdmissionDecision:
    """Admit one save and wake its workflow; the decision stands even if waking fails."""
    return (await report_save_outcome(pool, client, task_queue, save, save_id)).decision
