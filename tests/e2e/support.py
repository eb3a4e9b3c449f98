"""Polling helper: wait on a condition with a timeout, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], bool],
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last value: {value!r}")
        await asyncio.sleep(interval_s)
