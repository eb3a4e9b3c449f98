"""The strict modes' limits: a sliding window of arrival times and a calendar-day count.

Unlike the generous mode's token bucket, which lets a window reach up to twice its
limit, `SlidingWindow` admits a request only while fewer than `requests` requests of
the same key were admitted in the `per_seconds` before it: no window of that length
ever holds more than the limit, and the (limit+1)th arrival within one is refused.
A refused request is not counted, so its Retry-After is exact: the moment the oldest
admitted arrival leaves the window. Time comes from a `SandboxClock`, which the admin
API moves forward, so tests cross a window without waiting for it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from datetime import date

from sandbox.config import DailyLimit, RateLimitConfig
from sandbox.rate_limit import calendar_day


class SandboxClock:
    """Monotonic and wall time, both ahead of the real clocks by an offset that only grows."""

    def __init__(self) -> None:
        self._offset_s = 0.0

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (windows are measured on it)."""
        return time.monotonic() + self._offset_s

    def wall(self) -> float:
        """Unix time in seconds (calendar days and reports use it)."""
        return time.time() + self._offset_s

    def advance(self, seconds: float) -> None:
        """Move both clocks `seconds` (≥ 0) forward."""
        if seconds < 0:
            raise ValueError("the sandbox clock only moves forward")
        self._offset_s += seconds


class SlidingWindow:
    """At most `limit.requests` admitted per key in any `limit.per_seconds`."""

    def __init__(self, limit: RateLimitConfig, clock: SandboxClock) -> None:
        self.limit = limit
        self._clock = clock
        self._arrivals: dict[str, deque[float]] = {}

    def wait(self, key: str) -> float:
        """0 when `key` may send now, else the seconds until the oldest arrival leaves."""
        now = self._clock.monotonic()
        arrivals = self._expire(key, now)
        if len(arrivals) < self.limit.requests:
            return 0.0
        return arrivals[0] + self.limit.per_seconds - now

    def take(self, key: str) -> None:
        """Count an admitted arrival of `key` (after `wait` said 0)."""
        self._arrivals.setdefault(key, deque()).append(self._clock.monotonic())

    def used(self, key: str) -> int:
        """Requests of `key` admitted in the window ending now."""
        return len(self._expire(key, self._clock.monotonic()))

    def _expire(self, key: str, now: float) -> deque[float]:
        arrivals = self._arrivals.setdefault(key, deque())
        while arrivals and arrivals[0] <= now - self.limit.per_seconds:
            arrivals.popleft()
        return arrivals


class DailyCount:
    """Requests admitted per calendar day in the limit's time zone (HubSpot's daily limit)."""

    def __init__(self, limit: DailyLimit, clock: SandboxClock) -> None:
        self.limit = limit
        self._clock = clock
        self._days: dict[date, int] = {}

    def wait(self) -> float:
        """0 when today has room, else the seconds until the day's midnight."""
        day, until_midnight_s = calendar_day(self.limit.time_zone, self._clock.wall())
        if self._days.get(day, 0) < self.limit.requests:
            return 0.0
        return max(until_midnight_s, math.ulp(0.0))

    def take(self) -> None:
        """Count an admitted request against today."""
        day, _ = calendar_day(self.limit.time_zone, self._clock.wall())
        self._days[day] = self._days.get(day, 0) + 1

    def used(self) -> int:
        """Requests admitted today."""
        day, _ = calendar_day(self.limit.time_zone, self._clock.wall())
        return self._days.get(day, 0)
