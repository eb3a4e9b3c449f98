"""Repeated warnings are logged once per interval with a count (the ingress once logged
`could not start event workflow: TimeoutError` 7,384 times in one run)."""

from __future__ import annotations

import logging

import pytest

from services.logthrottle import ThrottledLog


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    throttled = ThrottledLog(logging.getLogger("test.throttle"), interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for _ in range(7384):
            throttled.warning("could not start event workflow: %s", "TimeoutError")
        throttled.warning("could not start event workflow: %s", "RPCError")  # another cause
        clock.now += 61
        throttled.warning("could not start event workflow: %s", "TimeoutError")
    assert [r.getMessage() for r in caplog.records] == [
        "could not start event workflow: TimeoutError",
        "could not start event workflow: RPCError",
        "could not start event workflow: TimeoutError (7384 times in the last 60 s)",
    ]
