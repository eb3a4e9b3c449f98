"""A page of an initial sync admitted set-wise (API-3, WF-2; NF-7's scale).

The same admission as the HTTP batch (`POST /v1/saves/batch`): one transaction, every
link-key lock taken in one statement in key order, one read per fact and one write per
kind for the whole page. No idempotency record: a re-run skips what a page admitted
by reading the links and attempts themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from protocol.admission import AdmissionDecision, SaveRequest
from services.save_entry import admit_batch


def _no_body(_: list[AdmissionDecision]) -> str:
    return ""


async def admit_set(pool: asyncpg.Pool, saves: Sequence[SaveRequest]) -> list[AdmissionDecision]:
    """Admit `saves` in one transaction; the decisions are in the saves' order."""
    outcome = await admit_batch(pool, saves, _no_body)
    assert outcome.decisions is not None  # no idempotency claim: never a replay
    return outcome.decisions
