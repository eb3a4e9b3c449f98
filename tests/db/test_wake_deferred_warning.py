"""Issue 33 item 6: during a Temporal outage every save's wake-up is deferred to the
relay; the warning saying so is logged once per cause and interval with the count of
the saves it stands for, not once per save (the ingress's throttle, services/logthrottle)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from temporalio.client import Client

from cli.stack.process import free_port
from services import save_entry
from services.logthrottle import ThrottledLog
from services.save_entry import WakeStatus, admit_one, decision_link_key, wake_best_effort
from tests.ingress.test_save_wake_deferred import SAVE, TASK_QUEUE, _demo_pool

SAVES = 40
WAKE_TIMEOUT_S = 0.5


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_temporal_outage_logs_one_wake_warning_per_interval_with_a_count(
    db_dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = await _demo_pool(db_dsn)
    temporal = await Client.connect(f"127.0.0.1:{free_port()}", lazy=True)  # nobody there
    clock = _Clock()  # the interval passes when the test says so, not after 60 s
    monkeypatch.setattr(save_entry, "warn", ThrottledLog(save_entry.log, clock=clock))

    async def wake() -> WakeStatus:
        return await wake_best_effort(
            temporal, TASK_QUEUE, decision, None, WAKE_TIMEOUT_S, pool=pool, save=SAVE
        )

    try:
        decision = await admit_one(pool, SAVE)
        with caplog.at_level(logging.WARNING, logger=save_entry.log.name):
            assert set(await asyncio.gather(*(wake() for _ in range(SAVES)))) == {
                WakeStatus.DEFERRED
            }
            during = [r.getMessage() for r in caplog.records]
            clock.now += 61
            assert await wake() is WakeStatus.DEFERRED
    finally:
        await pool.close()
    [line] = during  # one cause, one line, not one per save
    assert line.startswith("wake-up deferred to the relay: ")
    assert caplog.records[0].link_key == decision_link_key(decision)  # type: ignore[attr-defined]
    assert caplog.records[-1].getMessage() == f"{line} ({SAVES} times in the last 60 s)"
