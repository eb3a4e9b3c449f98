"""Polling helper: wait on a condition with a timeout, never a bare sleep."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
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


def eventually_sync(
    probe: Callable[[], T],
    until: Callable[[T], bool],
    timeout_s: float = 30.0,
    interval_s: float = 0.2,
) -> T:
    """`eventually` for tests that drive processes without an event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last value: {value!r}")
        time.sleep(interval_s)


def wait_for_output(
    log: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float
) -> str:
    """Poll a child's log until `text` appears; fail early if the child exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        output = log.read_text(errors="replace")
        if text in output:
            return output
        assert process.poll() is None, f"process exited early:\n{output}"
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not printed within {timeout_s}s:\n{log.read_text()}")
