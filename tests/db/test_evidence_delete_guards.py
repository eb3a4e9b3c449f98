"""G-3 (JRN-2) against real Postgres: evidence that matters cannot be deleted, directly or
by cascade, and retention skips exactly what Postgres refuses (migration 0170).

Every PATCH and attempt status is driven by the legal walk of `protocol.states`, with a
send-journal row wherever one can exist, so the SQL's status lists are checked against
`db.retention.SETTLED_PATCH_STATUSES` and `protocol.states.ATTEMPT_RELEASED`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from db import journal as jq
from db.errors import EvidenceGuardError, invariant_errors
from db.retention import SETTLED_PATCH_STATUSES
from protocol.retention import PruneInput
from protocol.states import (
    ATTEMPT_RELEASED,
    ATTEMPT_TRANSITIONS,
    PATCH_TRANSITIONS,
    AttemptStatus,
    PatchStatus,
)
from services.retention import prune
from tests.db.journal_support import sent_attempt
from tests.db.rows import insert_link, insert_pack_install, insert_patch, path_to, set_status

# The outcome of a PATCH's one try that lets it reach each status legally (C-2: `failed`
# needs a definite rejection; `ambiguous_remote_effect` is the lost answer of issue 47).
_PATCH_OUTCOME: dict[PatchStatus, tuple[str, int | None] | None] = {
    PatchStatus.PROCESSING: None,
    PatchStatus.SUCCEEDED: ("answered", 200),
    PatchStatus.AMBIGUOUS_REMOTE_EFFECT: ("no_answer", None),
    PatchStatus.FAILED: ("answered", 400),
    PatchStatus.SUPERSEDED: ("answered", 400),
}
_JOURNAL_OF_PATCH = "DELETE FROM connector_send_journal WHERE patch_id = $1"
_PATCH = "DELETE FROM connector_patch_dispatch WHERE patch_id = $1"
# One statement deleting both, each order: the parent's guard decides either way.
_BOTH_JOURNAL_FIRST = (
    "WITH j AS (DELETE FROM connector_send_journal WHERE patch_id = $1 RETURNING 1) "
    "DELETE FROM connector_patch_dispatch WHERE patch_id = $1"
)
_BOTH_PATCH_FIRST = (
    "WITH p AS (DELETE FROM connector_patch_dispatch WHERE patch_id = $1 RETURNING 1) "
    "DELETE FROM connector_send_journal WHERE patch_id = $1"
)


async def _refused_g3(conn: asyncpg.Connection, sql: str, key: object, naming: str) -> None:
    """`sql` is refused with the G-3 evidence guard (CP004), and the message names the row."""
    with pytest.raises(EvidenceGuardError) as raised, invariant_errors():
        async with conn.transaction():
            await conn.execute(sql, key)
    message = str(raised.value)
    assert "G-3" in message and naming in message, message


async def _deletes_journal(conn: asyncpg.Connection, sql: str, patch_id: uuid.UUID) -> None:
    """`sql` deletes the PATCH's journal rows (with or without the PATCH); rolled back so the
    next order starts from the same rows."""
    tx = conn.transaction()
    await tx.start()
    try:
        assert await conn.execute(sql, patch_id) != "DELETE 0"
        assert await _journal_count(conn, "patch_id", patch_id) == 0
    finally:
        await tx.rollback()


async def _patch_in(
    conn: asyncpg.Connection, goal: PatchStatus, link_key: str | None = None
) -> uuid.UUID:
    """A PATCH walked legally to `goal`, with one journal row unless `goal` is pending."""
    link_key = link_key or await insert_link(conn, await insert_pack_install(conn))
    patch_id = await insert_patch(conn, link_key=link_key)
    if goal is PatchStatus.PENDING:
        return patch_id
    token = uuid.uuid4()
    await conn.execute(
        "UPDATE connector_patch_dispatch SET status = 'processing', claim_token = $2, "
        "profile_snapshot = '{}'::jsonb WHERE patch_id = $1",
        patch_id,
        token,
    )
    journal_id = await jq.checkpoint_patch(conn, patch_id, token)
    assert journal_id is not None
    outcome = _PATCH_OUTCOME[goal]
    if outcome is not None:
        assert await jq.record_outcome(conn, journal_id, outcome[0], outcome[1], None, None)
    for step in path_to(PATCH_TRANSITIONS, PatchStatus.PROCESSING, goal):
        await set_status(conn, "patch", patch_id, str(step))
    return patch_id


async def _journal_count(conn: asyncpg.Connection, column: str, key: uuid.UUID) -> int:
    return int(
        await conn.fetchval(f"SELECT count(*) FROM connector_send_journal WHERE {column} = $1", key)
    )


# -- the reproduction of issue 47 -----------------------------------------------------------


async def test_g3_a_patch_whose_answer_was_lost_keeps_its_row_and_journal(
    conn: asyncpg.Connection,
) -> None:
    """G-3: an `ambiguous_remote_effect` PATCH and its journal row survive every DELETE."""
    patch_id = await _patch_in(conn, PatchStatus.AMBIGUOUS_REMOTE_EFFECT)
    journal_id = await conn.fetchval(
        "SELECT journal_id FROM connector_send_journal WHERE patch_id = $1", patch_id
    )
    await _refused_g3(
        conn, "DELETE FROM connector_send_journal WHERE journal_id = $1", journal_id, str(patch_id)
    )
    await _refused_g3(conn, _JOURNAL_OF_PATCH, patch_id, f"journal row {journal_id}")
    await _refused_g3(conn, _PATCH, patch_id, str(patch_id))  # would cascade to the journal
    await _refused_g3(conn, _BOTH_JOURNAL_FIRST, patch_id, str(patch_id))
    await _refused_g3(conn, _BOTH_PATCH_FIRST, patch_id, str(patch_id))
    assert await _journal_count(conn, "patch_id", patch_id) == 1
    assert await conn.fetchval(
        "SELECT status FROM connector_patch_dispatch WHERE patch_id = $1", patch_id
    ) == str(PatchStatus.AMBIGUOUS_REMOTE_EFFECT)


# -- every PATCH status: deletable exactly when settled -------------------------------------


def test_g3_the_settled_patch_statuses_are_the_ones_g3_names() -> None:
    """G-3 names them: succeeded, failed, superseded; every other status is protected."""
    assert {str(s) for s in SETTLED_PATCH_STATUSES} == {"succeeded", "failed", "superseded"}


@pytest.mark.parametrize("status", list(PatchStatus))
async def test_g3_a_patch_and_its_journal_are_deletable_only_when_settled(
    conn: asyncpg.Connection, status: PatchStatus
) -> None:
    """G-3, both orders: the journal row first then the PATCH, or the PATCH (cascade)."""
    patch_id = await _patch_in(conn, status)
    journal_rows = await _journal_count(conn, "patch_id", patch_id)
    assert journal_rows == (0 if status is PatchStatus.PENDING else 1)
    orders = [_PATCH, _BOTH_JOURNAL_FIRST, _BOTH_PATCH_FIRST]
    if journal_rows:
        orders.append(_JOURNAL_OF_PATCH)
    for sql in orders:
        if status in SETTLED_PATCH_STATUSES:
            await _deletes_journal(conn, sql, patch_id)
        else:
            await _refused_g3(conn, sql, patch_id, str(patch_id))
    if status in SETTLED_PATCH_STATUSES:  # journal first, then the PATCH, as two statements
        assert await conn.execute(_JOURNAL_OF_PATCH, patch_id) == "DELETE 1"
        assert await conn.execute(_PATCH, patch_id) == "DELETE 1"


# -- attempts: never deleted; their journal only once released -------------------------------

_ATTEMPT_STATUSES_WITH_A_JOURNAL = [s for s in AttemptStatus if s is not AttemptStatus.PENDING]


@pytest.mark.parametrize("status", _ATTEMPT_STATUSES_WITH_A_JOURNAL)
async def test_g3_an_attempt_is_never_deleted_and_its_journal_only_once_released(
    conn: asyncpg.Connection, status: AttemptStatus
) -> None:
    """G-3: every attempt status refuses DELETE; its journal rows go only once it is
    finalized or superseded (`ATTEMPT_RELEASED`, the statuses that free its slot)."""
    # A definite rejection, so the legal walk may reach terminal_failed and superseded.
    attempt_id, journal_id = await sent_attempt(conn, "answered", 400)
    for step in path_to(ATTEMPT_TRANSITIONS, AttemptStatus.PROCESSING, status):
        await set_status(conn, "attempt", attempt_id, str(step))
    await _refused_g3(
        conn,
        "DELETE FROM connector_push_attempt WHERE attempt_id = $1",
        attempt_id,
        str(attempt_id),
    )
    journal = "DELETE FROM connector_send_journal WHERE journal_id = $1"
    if status in ATTEMPT_RELEASED:
        await conn.execute(journal, journal_id)
        assert await _journal_count(conn, "attempt_id", attempt_id) == 0
    else:
        await _refused_g3(conn, journal, journal_id, str(attempt_id))
        assert await _journal_count(conn, "attempt_id", attempt_id) == 1


# -- retention skips exactly what Postgres refuses -------------------------------------------


async def test_g3_retention_skips_protected_rows_and_prunes_settled_ones(
    conn: asyncpg.Connection,
) -> None:
    """G-3, OPS-3: with no PATCH kept for its recency, prune deletes every settled PATCH
    with its journal, keeps every other one with its journal, and fails on none; each row
    it kept is one Postgres refuses to delete."""
    patches = {status: await _patch_in(conn, status) for status in PatchStatus}
    attempt_id, _ = await sent_attempt(conn, "no_answer")
    request = PruneInput(older_than_seconds=0, keep_patches_per_link=0, batch_size=2)
    report = await prune(conn, request, datetime.now(UTC) + timedelta(days=1))
    settled = {s: p for s, p in patches.items() if s in SETTLED_PATCH_STATUSES}
    assert (report.counts.patches, report.counts.patch_journal) == (len(settled), len(settled))
    kept = {
        r["patch_id"] for r in await conn.fetch("SELECT patch_id FROM connector_patch_dispatch")
    }
    assert kept == set(patches.values()) - set(settled.values())
    for patch_id in kept:
        await _refused_g3(conn, _PATCH, patch_id, str(patch_id))
        if await _journal_count(conn, "patch_id", patch_id):
            await _refused_g3(conn, _JOURNAL_OF_PATCH, patch_id, str(patch_id))
    assert await _journal_count(conn, "attempt_id", attempt_id) == 1
