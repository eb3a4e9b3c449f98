"""bench/floor_rounds.settled_result (issue 32 item 4): a floor workflow's result is asked
for again when a long poll has not answered within RESULT_ASK_AGAIN_S, so a wake-up the
dev server missed (measured: 20 s late, its long-poll expiry) cannot hold a round."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from temporalio.client import WorkflowHandle

import bench.floor_rounds as floor_rounds
from bench.floor_rounds import settled_result


class MissedWakeUp:
    """A handle whose first long poll is never answered (the server missed its wake-up)
    and whose next one answers at once, as a fresh poll of a closed history does."""

    def __init__(self) -> None:
        self.polls = 0

    async def result(self) -> str:
        self.polls += 1
        if self.polls == 1:
            await asyncio.Event().wait()  # never woken
        return "done"


async def test_a_missed_wake_up_costs_one_ask_again_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(floor_rounds, "RESULT_ASK_AGAIN_S", 0.2)
    handle = MissedWakeUp()
    result = await asyncio.wait_for(
        settled_result(cast(WorkflowHandle[Any, Any], handle)), timeout=5
    )
    assert (result, handle.polls) == ("done", 2)
