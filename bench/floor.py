"""The floor: the cheapest workflow shaped like a create — signal-with-start, one activity.

Its rate on the same server is what the create path is compared with (P1), so the
figure measures our overhead, not the machine or the Temporal configuration. The same
workflow runs the activity its input names: `floor_noop` here, or `floor_io`
(bench/floor_io.py), which does the I/O a create cannot avoid (P1_io, issue 32).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow


class FloorInput(BaseModel):
    key: str
    activity: str = "floor_noop"


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
        result: str = await workflow.execute_activity(
            input.activity, input, start_to_close_timeout=timedelta(seconds=30), result_type=str
        )
        return result
