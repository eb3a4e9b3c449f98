"""The slot of its remote budget every remote step waits for before it claims its send
(SPEC NF-8, PROF-3); the rates and the slots are `services.rate_limit`. The slots space
a budget's steps; each request's send window turn (`services.send_window`, taken in
`services.remote.send`) is what bounds the budget's windows (NF-8')."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from protocol.messages import StepKind, StepResult
from services import rate_limit
from services.link_step import view


@dataclass(frozen=True)
class PaceSlot:
    """Where the step was scheduled: its task queue, and the fairness key and weight of
    the budget it spends (None: the budget is not limited)."""

    task_queue: str
    fairness_key: str | None
    fairness_weight: float | None


async def paced(pool: asyncpg.Pool, key: str, slot: PaceSlot) -> StepResult | None:
    """Wait for this step's slot of its budget, then None: go on and send. When the slot
    is further off than an activity may wait, nothing is sent or reserved: the link's
    workflow waits that long in a timer and runs the step again (RETRY_LATER, no retry
    spent)."""
    later = await rate_limit.reserve_pace(
        pool, slot.task_queue, slot.fairness_key, slot.fairness_weight
    )
    if later is None:
        return None
    async with pool.acquire() as conn:
        now = await view(conn, key)
    detail = f"remote budget paced: its next request slot is {later:.0f} s away"
    kind = StepKind.RETRY_LATER
    return StepResult(kind=kind, view=now, detail=detail, retry_after_seconds=later)
