"""SPEC OPS-3: the worker's daily prune is a Temporal Schedule, created idempotently when
retention is configured and removed when it is not; a run deletes finished rows."""

from __future__ import annotations

import pytest
from temporalio.service import RPCError

from protocol.retention import PruneInput
from tests.db.rows import insert_event, set_status
from tests.e2e.conftest import Stack
from tests.e2e.support import eventually
from worker.schedules import PRUNE_HOUR_UTC, ensure_prune_schedule, prune_schedule_id
from worker.settings import RuntimeSettings


async def test_the_prune_schedule_runs_daily_and_is_removed_when_unconfigured(
    stack: Stack,
) -> None:
    async with stack.pool.acquire() as conn:
        finished, waiting = await insert_event(conn), await insert_event(conn)
        await set_status(conn, "event", finished, "processed")
    # Every row written before the run counts as old: the run deletes the finished event.
    prune = PruneInput(older_than_seconds=0)
    handle = await ensure_prune_schedule(stack.client, stack.task_queue, prune)
    assert handle is not None
    try:
        again = await ensure_prune_schedule(stack.client, stack.task_queue, prune)
        assert again is not None and again.id == handle.id == prune_schedule_id(stack.task_queue)
        [calendar] = (await handle.describe()).schedule.spec.calendars
        assert [(r.start, r.end) for r in calendar.hour] == [(PRUNE_HOUR_UTC, PRUNE_HOUR_UTC)]
        await handle.trigger()
        left = await eventually(
            lambda: stack.pool.fetch("SELECT event_id FROM connector_event"),
            lambda rows: [r["event_id"] for r in rows] == [waiting],
        )
        assert left  # the admitted event stays
    finally:
        assert await ensure_prune_schedule(stack.client, stack.task_queue, None) is None
    with pytest.raises(RPCError):
        await handle.describe()
    # Unconfigured twice: deleting a missing schedule is not an error.
    assert await ensure_prune_schedule(stack.client, stack.task_queue, None) is None


def test_retention_is_configured_by_an_age_and_a_bad_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONNECTOR_PUSH_PRUNE_OLDER_THAN", "30d")
    prune = RuntimeSettings().prune_input()
    assert prune is not None and prune.older_than_seconds == 30 * 86_400
    monkeypatch.delenv("CONNECTOR_PUSH_PRUNE_OLDER_THAN")
    assert RuntimeSettings().prune_input() is None
    monkeypatch.setenv("CONNECTOR_PUSH_PRUNE_OLDER_THAN", "a month")
    with pytest.raises(ValueError, match="CONNECTOR_PUSH_PRUNE_OLDER_THAN"):
        RuntimeSettings()
