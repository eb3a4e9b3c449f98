"""SPEC §17 G-7: a link step's requests end before its activity's start-to-close does. The
step's deadline is taken from the running activity's info (Temporal's own activity test
environment), so time the try already spent (a pacing wait) shortens the next request."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from activities.link import link_step
from protocol.timeouts import REMOTE_HTTP_TIMEOUT, REQUEST_DEADLINE_MARGIN, request_deadline_s
from services.dispatch_hooks import DispatchHooks

NO_POOL: Any = None  # the step is only asked for its deadline
NO_HTTP: Any = None


@activity.defn
async def deadline_probe() -> float | None:
    """The running step's time left, as `services.remote.send` will compute it."""
    step = link_step(NO_POOL, NO_HTTP, DispatchHooks())
    return None if step.deadline is None else step.deadline - asyncio.get_running_loop().time()


async def _time_left(spent: timedelta, start_to_close: timedelta | None) -> float | None:
    env = ActivityEnvironment()
    started = datetime.now(UTC) - spent
    env.info = dataclasses.replace(
        env.info, start_to_close_timeout=start_to_close, started_time=started
    )
    left: float | None = await env.run(deadline_probe)
    return left


async def test_g7_the_step_deadline_is_the_activity_start_to_close_less_time_spent() -> None:
    left = await _time_left(timedelta(seconds=20), timedelta(seconds=30))
    assert left == pytest.approx(10.0, abs=0.5)
    assert left is not None
    margin = REQUEST_DEADLINE_MARGIN.total_seconds()
    assert request_deadline_s(left) == pytest.approx(10.0 - margin, abs=0.5)


async def test_g7_a_try_with_its_time_spent_sends_nothing() -> None:
    left = await _time_left(timedelta(seconds=29), timedelta(seconds=30))
    assert left is not None and request_deadline_s(left) <= 0


async def test_g7_an_activity_without_start_to_close_has_only_the_request_timeout() -> None:
    assert await _time_left(timedelta(seconds=20), None) is None
    assert request_deadline_s(None) == REMOTE_HTTP_TIMEOUT.total_seconds()
