"""Every CRM entry's admission-then-wake (SPEC WF-2, API-2), shared by the Python API,
the `save` and `push` commands and the HTTP save API.

Admission commits in Postgres first; only then is the link's workflow woken, best
effort and bounded in time. A wake-up that fails or times out changes nothing the
caller was told: the relay signals every link with pending work later.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final

import asyncpg
from temporalio.client import Client

from db import link_batches as batch_q
from db import save_api as q
from db.bounded import bounded_transaction
from db.records import Conn
from protocol.admission import (
    AdmissionDecision,
    CreateReserved,
    DeferredAssociationReserved,
    PatchQueued,
    Rejected,
    SaveRequest,
)
from protocol.errors import RejectReason
from protocol.rate_limit import RemoteBudgetResult
from protocol.summary import LinkFacts, facts_of_save
from services.admission import admit_all_locked, admit_save, key_or_rejection
from services.admission_facts import SaveToAdmit
from services.logthrottle import ThrottledLog
from services.rate_limit import queued_patch_budget, reservation_budget
from services.record_store import PostgresRecordStore
from services.wake import wake_link

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

# Long enough for a healthy frontend under load, short enough that a caller never
# waits on a Temporal outage (the relay covers a wake-up that did not happen).
WAKE_TIMEOUT_S: Final = 2.0


class WakeStatus(StrEnum):
    """What became of the wake-up after the admission committed."""

    SIGNALLED = "signalled"  # signal-with-start accepted by Temporal
    DEFERRED = "deferred"  # Temporal unreachable or slow: the relay dispatches it
    NOT_NEEDED = "not_needed"  # nothing for the workflow to do


def decision_link_key(decision: AdmissionDecision) -> str | None:
    if isinstance(decision, CreateReserved | DeferredAssociationReserved):
        return decision.reservation.link_key
    return decision.link_key


def wakes_workflow(decision: AdmissionDecision) -> bool:
    """Work was queued, or a link was just suspended and its workflow must publish it."""
    if decision_link_key(decision) is None:
        return False
    if isinstance(decision, Rejected):
        return decision.reason is RejectReason.DRIFT_FAIL_CLOSED
    return True


def new_idempotency_key() -> tuple[str, str]:
    """A fresh request idempotency key and its locator value (GATE-2)."""
    key = str(uuid.uuid4())
    return key, f"cp-{key}"


async def admit_one(pool: asyncpg.Pool, save: SaveRequest) -> AdmissionDecision:
    """One save's admission in its own transaction, with fresh keys and the wall clock."""
    key, locator = new_idempotency_key()
    return await admit_save(
        pool, save, idempotency_key=key, locator_value=locator, now=datetime.now(UTC)
    )


def _facts(key: str, decision: AdmissionDecision, save: SaveRequest | None) -> LinkFacts | None:
    """The link's facts from the save, or else from the reservation; None: unknown here."""
    if save is not None:
        return facts_of_save(key, save)
    if isinstance(decision, CreateReserved | DeferredAssociationReserved):
        reservation = decision.reservation
        return LinkFacts(
            link_key=key,
            source_record_id=reservation.source_record_id,
            **reservation.slot.model_dump(),
        )
    return None


async def _budget(
    pool: asyncpg.Pool | None, decision: AdmissionDecision
) -> RemoteBudgetResult | None:
    """PROF-3: the reservation's or the queued PATCH's budget (cached rates); None: the
    workflow looks it up."""
    if pool is None:
        return None
    try:
        if isinstance(decision, CreateReserved | DeferredAssociationReserved):
            return await reservation_budget(pool, decision.reservation.request)
        if isinstance(decision, PatchQueued) and decision.budget_key is not None:
            return await queued_patch_budget(pool, decision.budget_key)
        return None
    except (asyncpg.PostgresError, OSError):
        return None


async def wake_best_effort(
    client: Client | None,
    task_queue: str,
    decision: AdmissionDecision,
    save_id: str | None = None,
    timeout_s: float = WAKE_TIMEOUT_S,
    *,
    pool: asyncpg.Pool | None = None,
    save: SaveRequest | None = None,
    bulk: bool = False,
) -> WakeStatus:
    """Wake the decision's workflow if it has work; never raises for Temporal's sake.
    With `pool`, a reserved create's workflow starts already paced by its budget; with
    `save`, it starts with its summary and static search attributes (OPS-1); `bulk`
    (a bulk `push`): its remote steps yield to single saves (NF-8)."""
    key = decision_link_key(decision)
    if key is None or not wakes_workflow(decision):
        return WakeStatus.NOT_NEEDED
    if client is None:
        return WakeStatus.DEFERRED
    try:
        # The budget read is inside the bound too: the save is committed, so a Postgres
        # that stops answering (or a pool closing under us) defers the wake-up, it never
        # holds or fails the caller's answer.
        async with asyncio.timeout(timeout_s):
            budget = await _budget(pool, decision)
            facts = _facts(key, decision, save)
            await wake_link(client, task_queue, key, save_id, budget, facts, bulk=bulk)
    except Exception as error:  # Temporal or Postgres down or slow: the relay wakes it later
        # Once per save during an outage: one line per cause and minute, with a count.
        warn.warning(
            "wake-up deferred to the relay: %s", type(error).__name__, extra={"link_key": key}
        )
        return WakeStatus.DEFERRED
    return WakeStatus.SIGNALLED


# -- the HTTP save API: a batch and its idempotency record in one transaction ----------


class IdempotencyConflict(Exception):
    """The client reused an `Idempotency-Key` for a different request."""


async def _admit_in(conn: Conn, saves: Sequence[SaveRequest]) -> list[AdmissionDecision]:
    """Admit saves inside the caller's transaction set-wise: every link-key lock in one
    statement, in key order (so two batches naming the same records cannot deadlock),
    then one read per fact and one write per kind for the whole batch."""
    items: dict[int, SaveToAdmit] = {}
    decisions: dict[int, AdmissionDecision] = {}
    for i, save in enumerate(saves):
        key = key_or_rejection(save)
        if isinstance(key, Rejected):
            decisions[i] = key
            continue
        idempotency_key, locator = new_idempotency_key()
        items[i] = SaveToAdmit(key, save, idempotency_key, locator)
    if items:
        await batch_q.lock_link_keys(conn, [item.key for item in items.values()])
        admitted = await admit_all_locked(conn, list(items.values()), datetime.now(UTC))
        decisions.update(zip(items, admitted, strict=True))
    return [decisions[i] for i in range(len(saves))]


@dataclass(frozen=True)
class BatchOutcome:
    """The answer body (JSON text) and, when this request admitted, its decisions."""

    body: str
    decisions: list[AdmissionDecision] | None  # None: a replay of the stored first answer


class _LostKeyRace(Exception):
    """A concurrent request with the same key committed first: roll back, then replay."""


# Given the owner key the store holds for each saved record (absent: not held), raises
# to refuse the whole request before anything is written (S-1).
OwnerCheck = Callable[[Mapping[tuple[str, str], str | None]], None]


async def admit_batch(
    pool: asyncpg.Pool,
    saves: Sequence[SaveRequest],
    render: Callable[[list[AdmissionDecision]], str],
    idempotency: q.IdempotencyClaim | None = None,
    check_owners: OwnerCheck | None = None,
) -> BatchOutcome:
    """Admit every save and store the rendered answer under the client's idempotency key,
    all in one transaction (API-1): a repeat returns the first answer, admitting nothing.
    `check_owners` (the save API, S-1) sees the records' owners first, in the same
    transaction, and may raise to refuse the request with nothing written.

    Raises `IdempotencyConflict` when the key was used for a different request.
    """
    for _ in range(2):
        try:
            # NF-5: a hung Postgres never holds the answer past the caller's deadline.
            async with bounded_transaction(pool) as conn:
                if check_owners is not None:
                    keys = sorted({(s.source_object, s.source_record_id) for s in saves})
                    check_owners(await PostgresRecordStore(conn).read_owners(keys))
                return await _admit_or_replay(conn, saves, render, idempotency)
        except _LostKeyRace:
            continue
    raise RuntimeError("idempotency key raced twice")  # unreachable: the row now exists


async def _admit_or_replay(
    conn: Conn,
    saves: Sequence[SaveRequest],
    render: Callable[[list[AdmissionDecision]], str],
    idempotency: q.IdempotencyClaim | None,
) -> BatchOutcome:
    if idempotency is not None:
        stored = await q.stored_answer(conn, idempotency)
        if stored is not None:
            if stored.request_hash != idempotency.request_hash:
                raise IdempotencyConflict(idempotency.key)
            return BatchOutcome(stored.body, None)
    decisions = await _admit_in(conn, saves)
    body = render(decisions)
    if idempotency is not None and not await q.store_answer(conn, idempotency, body):
        raise _LostKeyRace
    return BatchOutcome(body, decisions)
