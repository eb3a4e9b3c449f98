"""`connector-push push` reads "already linked" and "slot held" in one snapshot: a create that
finalizes between the two reads (its link not yet there for the first, its attempt already
released for the second) is still counted as held, not admitted again (seen in a loaded
test run: `--all --limit 1` counted the record it had to skip as a new admission)."""

from __future__ import annotations

import asyncpg
import pytest

from cli import push_run
from cli.push_progress import Tally
from protocol.states import ATTEMPT_INITIAL, ATTEMPT_TRANSITIONS, AttemptStatus
from tests.db.rows import insert_attempt, insert_link, insert_pack_install, path_to, set_status

TARGET = push_run.Target("owner-1", "action-1", "dest-1", "Contact", "alice")


async def test_a_create_finalizing_between_the_reads_is_still_skipped(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = TARGET.key("c-001")
    async with db_pool.acquire() as conn:
        install = await insert_pack_install(conn)
        attempt = await insert_attempt(conn, install, link_key=key)
    real_linked_keys = push_run.q.linked_keys
    finalized = False

    async def linked_then_the_create_finalizes(
        conn: asyncpg.Connection, keys: list[str]
    ) -> set[str]:
        nonlocal finalized
        linked = await real_linked_keys(conn, keys)
        async with db_pool.acquire() as other, other.transaction():  # the worker, meanwhile
            for step in path_to(ATTEMPT_TRANSITIONS, ATTEMPT_INITIAL, AttemptStatus.FINALIZED):
                await set_status(other, "attempt", attempt, step.value)
            await insert_link(other, install, link_key=key)
        finalized = True
        return linked

    monkeypatch.setattr(push_run.q, "linked_keys", linked_then_the_create_finalizes)
    tally = Tally()
    todo = await push_run.unclaimed(db_pool, TARGET, ["c-001"], tally)

    assert finalized
    assert todo == []
    assert tally.skipped_linked + tally.skipped_active == 1
