"""The journal verdict a parked ambiguous attempt's view carries (SPEC §17 G-6, JRN-1),
read from the real rows: the view the workflow publishes (`services.link_step.view`) and
`links show` both get it from `services.landing.with_landing`."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from db import journal as jq
from protocol.landing import Landing
from services.link_step import view
from tests.db.journal_support import sent_attempt
from tests.db.rows import set_status


async def _parked(conn: asyncpg.Connection, outcome: str | None, status: int | None) -> str:
    """An attempt with one try (its outcome, or still unanswered), parked ambiguous; its key."""
    attempt_id, _ = await sent_attempt(conn, outcome, status)
    assert await set_status(conn, "attempt", attempt_id, "ambiguous_remote_effect") == "UPDATE 1"
    key: str = await conn.fetchval(
        "SELECT link_key FROM connector_push_attempt WHERE attempt_id = $1", attempt_id
    )
    return key


@pytest.mark.parametrize(
    ("outcome", "status", "verdict"),
    [
        ("answered", 400, Landing.PROVED_NOT_LANDED),  # refused for good
        ("answered", 429, Landing.PROVED_NOT_LANDED),  # declared not applied (PROF-1)
        ("not_sent", None, Landing.PROVED_NOT_LANDED),
        ("no_answer", None, Landing.MAY_HAVE_LANDED),
        ("answered", 409, Landing.MAY_HAVE_LANDED),  # may say the object exists (C-1)
        (None, None, Landing.MAY_HAVE_LANDED),  # still unanswered
    ],
)
async def test_the_view_of_a_parked_attempt_carries_its_journal_verdict(
    db_pool: asyncpg.Pool, outcome: str | None, status: int | None, verdict: Landing
) -> None:
    async with db_pool.acquire() as conn:
        key = await _parked(conn, outcome, status)
        parked = await view(conn, key)
    assert parked.attempt_landing is verdict
    assert (parked.attempt_tries_may_have_landed == 0) is (verdict is Landing.PROVED_NOT_LANDED)


async def test_a_late_answer_turns_the_verdict(db_pool: asyncpg.Pool) -> None:
    """The try was unanswered when the attempt parked; its answer, recorded late (JRN-1:
    once), proves it refused: the next view says so, the row itself stays as it was."""
    async with db_pool.acquire() as conn:
        key = await _parked(conn, None, None)
        assert (await view(conn, key)).attempt_landing is Landing.MAY_HAVE_LANDED
        [row] = await conn.fetch(
            "SELECT j.journal_id FROM connector_send_journal j JOIN connector_push_attempt a"
            " USING (attempt_id) WHERE a.link_key = $1",
            key,
        )
        assert await jq.record_outcome(conn, row["journal_id"], "answered", 400, None, None)
        now = await view(conn, key)
    assert now.attempt_landing is Landing.PROVED_NOT_LANDED
    assert now.attempt_status == "ambiguous_remote_effect"


async def test_only_a_parked_ambiguous_attempt_is_judged(db_pool: asyncpg.Pool) -> None:
    """Any other state reads nothing more (a create's ordinary step pays for no query)."""
    async with db_pool.acquire() as conn:
        attempt_id, _ = await sent_attempt(conn, "answered", 400)
        key = await conn.fetchval(
            "SELECT link_key FROM connector_push_attempt WHERE attempt_id = $1", attempt_id
        )
        assert (await view(conn, key)).attempt_landing is None  # processing
        assert (await view(conn, "lk1_" + uuid.uuid4().hex * 2)).attempt_landing is None
