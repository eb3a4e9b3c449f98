"""Rate limits like the remote's burst window: a token bucket per object type, 429 when empty.

Each object type has its own bucket (`requests` tokens, refilled evenly over
`per_seconds`). A token bucket admits every stream that keeps to `requests` in
any rolling window of `per_seconds`, so a client paced to the limit never sees
a 429. Every admitted request is logged with its wall-clock time, so tests can
check the rolling windows a client actually produced.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as dt_time
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sandbox.config import DailyLimit, RateLimitConfig, SandboxConfig
from sandbox.replies import Reply

__all__ = ["DailyLimit", "RateLimitReport", "RateLimitSettings", "RateLimiter"]

# HubSpot names its policies by window; other windows get a name of the same shape.
_POLICY_NAMES = {10.0: "TEN_SECONDLY_ROLLING", 1.0: "SECONDLY", 86_400.0: "DAILY"}


class RateLimitSettings(BaseModel):
    """The limits in force: a default for every type and per-type overrides."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate_limit: RateLimitConfig | None = None
    object_types: dict[str, RateLimitConfig | None] = Field(default_factory=dict)
    daily: DailyLimit | None = None
    # Added to the wall clock for the daily limit's day, so a test turns the day at will.
    clock_offset_seconds: float = 0.0

    def limit_for(self, object_type: str) -> RateLimitConfig | None:
        if object_type in self.object_types:
            return self.object_types[object_type]
        return self.rate_limit


class AppliedRequest(BaseModel):
    """A remote-API request the limiter let through; `at` is Unix time in seconds."""

    at: float
    method: str
    object_type: str


class RateLimitReport(BaseModel):
    """What `/_sandbox/rate-limit` answers: the settings, 429s per type, admitted requests."""

    settings: RateLimitSettings
    throttled: dict[str, int]
    applied: list[AppliedRequest]


def settings_from(config: SandboxConfig) -> RateLimitSettings:
    """The start-up limits: the config's default plus every type's own override."""
    overrides = {name: t.rate_limit for name, t in config.object_types.items() if t.rate_limit}
    return RateLimitSettings(rate_limit=config.rate_limit, object_types=overrides)


def policy_name(limit: RateLimitConfig) -> str:
    """The policy named in a 429 body, e.g. `TEN_SECONDLY_ROLLING` for a 10 s window."""
    name = _POLICY_NAMES.get(limit.per_seconds)
    return name or f"{limit.per_seconds:g}_SECONDLY_ROLLING".replace(".", "_")


@dataclass
class _Bucket:
    limit: RateLimitConfig
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """Take a token; 0 when granted, else the seconds until one is available."""
        rate = self.limit.requests / self.limit.per_seconds
        self.tokens = min(self.limit.requests, self.tokens + (now - self.updated) * rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / rate


class RateLimiter:
    """One bucket per object type; `admit` answers None (go on) or the 429 to send."""

    def __init__(self, settings: RateLimitSettings) -> None:
        self._settings = settings
        self._buckets: dict[str, _Bucket] = {}
        self._throttled: dict[str, int] = {}
        self._applied: list[AppliedRequest] = []
        self._days: dict[date, int] = {}  # requests admitted per day of the daily limit

    def admit(self, method: str, object_type: str) -> Reply | None:
        """Count one request against the day's limit, then its type's bucket."""
        day, until_midnight = self._day()
        if day is not None and self._days.get(day, 0) >= self._daily_requests():
            return self._refuse(
                object_type, daily_limit_reached(self._daily_requests(), until_midnight)
            )
        limit = self._settings.limit_for(object_type)
        if limit is not None:
            wait_s = self._bucket(object_type, limit).take(time.monotonic())
            if wait_s > 0:
                return self._refuse(object_type, too_many_requests(limit, wait_s))
        if day is not None:
            self._days[day] = self._days.get(day, 0) + 1
        self._applied.append(AppliedRequest(at=time.time(), method=method, object_type=object_type))
        return None

    def _refuse(self, object_type: str, reply: Reply) -> Reply:
        self._throttled[object_type] = self._throttled.get(object_type, 0) + 1
        return reply

    def _daily_requests(self) -> int:
        assert self._settings.daily is not None
        return self._settings.daily.requests

    def _day(self) -> tuple[date | None, float]:
        """The daily limit's current day and the seconds to its midnight (None: no limit)."""
        daily = self._settings.daily
        if daily is None:
            return None, 0.0
        return calendar_day(daily.time_zone, time.time() + self._settings.clock_offset_seconds)

    def configure(self, settings: RateLimitSettings) -> None:
        """Replace the limits; buckets start full again."""
        self._settings = settings
        self._buckets.clear()
        self._days.clear()

    def reset(self) -> None:
        """Full buckets, no counts, no log (the settings stay)."""
        self._buckets.clear()
        self._throttled.clear()
        self._applied.clear()
        self._days.clear()

    def report(self) -> RateLimitReport:
        return RateLimitReport(
            settings=self._settings, throttled=dict(self._throttled), applied=list(self._applied)
        )

    def _bucket(self, object_type: str, limit: RateLimitConfig) -> _Bucket:
        bucket = self._buckets.get(object_type)
        if bucket is None:
            bucket = _Bucket(limit=limit, tokens=limit.requests, updated=time.monotonic())
            self._buckets[object_type] = bucket
        return bucket


def calendar_day(time_zone: str, at: float) -> tuple[date, float]:
    """The day in `time_zone` at Unix time `at`, and the seconds from `at` to its midnight."""
    zone = ZoneInfo(time_zone)
    now = datetime.fromtimestamp(at, zone)
    midnight = datetime.combine(now.date() + timedelta(days=1), dt_time(0), tzinfo=zone)
    return now.date(), (midnight - now).total_seconds()


def too_many_requests(limit: RateLimitConfig, wait_s: float) -> Reply:
    """HubSpot's 429: the policy named in the body, `Retry-After` in whole seconds."""
    policy = policy_name(limit)
    body: dict[str, JsonValue] = {
        "status": "error",
        "message": f"You have reached your {policy.lower()} limit.",
        "errorType": "RATE_LIMIT",
        "policyName": policy,
        "category": "RATE_LIMITS",
    }
    headers = {
        "Retry-After": str(max(1, math.ceil(wait_s))),
        "X-HubSpot-RateLimit-Max": str(limit.requests),
        "X-HubSpot-RateLimit-Remaining": "0",
        "X-HubSpot-RateLimit-Interval-Milliseconds": str(round(limit.per_seconds * 1000)),
    }
    return Reply(429, body, headers)


def daily_limit_reached(requests: int, until_midnight_s: float) -> Reply:
    """HubSpot's 429 for a spent daily limit: `policyName: DAILY`, retry after midnight."""
    body: dict[str, JsonValue] = {
        "status": "error",
        "message": "You have reached your daily limit.",
        "errorType": "RATE_LIMIT",
        "policyName": "DAILY",
        "category": "RATE_LIMITS",
    }
    headers = {
        "Retry-After": str(max(1, math.ceil(until_midnight_s))),
        "X-HubSpot-RateLimit-Daily": str(requests),
        "X-HubSpot-RateLimit-Daily-Remaining": "0",
    }
    return Reply(429, body, headers)
