"""The floor: the cheapest workflow shaped like a create — signal-with-start, one activity.

Its rate on the same server is what the create path is compared with (P1), so the
figure measures our overhead, not the machine or the Temporal configuration.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow


class FloorInput(BaseModel):
    key: str


@activity.defn
async def floor_noop(input: FloorInput) -> str:
    return input.key


@workflow.defn
class FloorWorkflow:
    def __init__(self) -> None:
        self._poked = False

    @workflow.signal
    def poke(self) -> None:
        self._poked = True

    @workflow.run
    async def run(self, input: FloorInput) -> str:
        await workflow.wait_condition(lambda: self._poked)
        return await workflow.execute_activity(
            floor_noop, input, start_to_close_timeout=timedelta(seconds=30)
        )
