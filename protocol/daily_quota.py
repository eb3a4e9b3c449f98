"""Daily request quotas (issue 33 item 3, SPEC NF-8): how much of a remote's daily quota a
budget may spend today, and when the day ends.

A profile's `rateLimit` may declare the remote's `dailyQuota` (requests per day), the
`dailyShare` of it this product may spend (the customer's other integrations spend the
rest) and the time zone whose midnight resets it (`dailyResetTimeZone`, HubSpot: the
account's; default UTC). A budget (one credential on one remote scope, PROF-3) gets the
smallest allowance any profile spending it declares. The counter is Postgres's
(`db.daily_quota`); these functions decide only the numbers and take `now` from the
caller, so they are pure and tested without a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, JsonValue

from protocol.manifest import (
    DEFAULT_DAILY_RESET_TIME_ZONE,
    PackManifest,
    RateLimit,
    daily_allowance,
)
from protocol.outcome import parse_json
from protocol.rate_limit import declared_limits

# HubSpot's 429 body names the policy it enforced; its daily limit is `DAILY`.
DAILY_POLICY_NAMES: Final = frozenset({"DAILY"})
# A waiting run re-checks this long after the reset, so a worker whose clock runs a little
# behind the one that counted the day does not find the old day still spent.
RESET_MARGIN_S: Final = 1.0


class DailyQuota(BaseModel):
    """What one budget may spend per day: `allowance` requests, reset at `time_zone`'s midnight."""

    model_config = ConfigDict(frozen=True)

    quota: int
    share: float
    time_zone: str = DEFAULT_DAILY_RESET_TIME_ZONE

    @property
    def allowance(self) -> int:
        return daily_allowance(self.quota, self.share)


def quota_of(limit: RateLimit) -> DailyQuota | None:
    if limit.daily_quota is None:
        return None
    return DailyQuota(
        quota=limit.daily_quota, share=limit.daily_share, time_zone=limit.daily_reset_time_zone
    )


def quota_day(now: datetime, time_zone: str) -> date:
    """The quota's day at `now` (aware): the calendar date in the reset time zone."""
    return now.astimezone(ZoneInfo(time_zone)).date()


def next_reset(now: datetime, time_zone: str) -> datetime:
    """The first midnight in `time_zone` after `now`, as an aware UTC-comparable instant."""
    zone = ZoneInfo(time_zone)
    tomorrow = now.astimezone(zone).date() + timedelta(days=1)
    return datetime.combine(tomorrow, time(0), tzinfo=zone)


def wait_seconds(now: datetime, resets_at: datetime, recheck_s: float | None = None) -> float:
    """How long a run waits for the quota: until just after the reset; at most `recheck_s`
    when set (then it looks again, and waits again if the day has not turned)."""
    wanted = max((resets_at - now).total_seconds(), 0.0) + RESET_MARGIN_S
    return wanted if recheck_s is None else min(wanted, recheck_s)


def budget_quotas(manifests: Iterable[PackManifest]) -> dict[str, DailyQuota]:
    """Every budget's daily quota, the smallest allowance where profiles differ."""
    quotas: dict[str, DailyQuota] = {}
    for key, limit in declared_limits(manifests):
        quota = quota_of(limit)
        known = quotas.get(key)
        if quota is not None and (known is None or quota.allowance < known.allowance):
            quotas[key] = quota
    return quotas


def names_daily_policy(status: int | None, body: bytes | None) -> bool:
    """A 429 whose body names the remote's daily limit (`policyName`), not its burst window."""
    if status != 429:
        return False
    parsed: JsonValue | None = parse_json(body)
    if not isinstance(parsed, dict):
        return False
    policy: Any = parsed.get("policyName")
    return isinstance(policy, str) and policy.upper() in DAILY_POLICY_NAMES


def waiting_detail(resets_at: datetime) -> str:
    """What the link's details and its step say while it waits."""
    return f"waiting for the daily quota until {resets_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
