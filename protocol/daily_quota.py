"""Daily request quotas (NF-8, PROF-5): how much of a remote's daily
quota a budget may spend today, and when a spent or refused day ends.

A profile's `rateLimit` may declare the remote's `dailyQuota` (requests per day) and the
`dailyShare` of it this product may spend (the customer's other integrations spend the
rest). How the remote says its daily allocation is spent, and when it frees, is the
profile's `dailyLimit` (PROF-5): an answer (status, optionally a body field and value)
and a reset rule, a calendar day in a time zone or a rolling window of hours. The runtime
knows no remote's answer or reset. A budget (one credential on one remote scope, PROF-3)
gets the smallest allowance any profile spending it declares. The counter is Postgres's
(`db.daily_quota`); these functions decide only the numbers and take `now` from the
caller, so they are pure and tested without a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict

from protocol.manifest import (
    DEFAULT_DAILY_RESET_TIME_ZONE,
    DailyReset,
    PackManifest,
    Profile,
    daily_allowance,
)
from protocol.rate_limit import budget_key

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


def quota_of(profile: Profile) -> DailyQuota | None:
    """The profile's counted daily quota; its day is the declared reset's calendar day
    (`dailyLimit.reset.timeZone`, else `rateLimit.dailyResetTimeZone`)."""
    limit = profile.rate_limit
    if limit is None or limit.daily_quota is None:
        return None
    declared = profile.daily_limit.reset.time_zone if profile.daily_limit else None
    return DailyQuota(
        quota=limit.daily_quota,
        share=limit.daily_share,
        time_zone=declared or limit.daily_reset_time_zone,
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


def refusal_resets_at(now: datetime, reset: DailyReset | None) -> datetime:
    """When a day the remote refused (PROF-5) frees: the next midnight of a calendar
    reset's zone, or a whole rolling window after the refusal (every request it counted
    has aged out by then). None (no rule frozen): the next UTC midnight."""
    if reset is not None and reset.rolling_hours is not None:
        return now + timedelta(hours=reset.rolling_hours)
    zone = reset.time_zone if reset is not None else None
    return next_reset(now, zone or DEFAULT_DAILY_RESET_TIME_ZONE)


def budget_quotas(manifests: Iterable[PackManifest]) -> dict[str, DailyQuota]:
    """Every budget's daily quota, the smallest allowance where profiles differ."""
    quotas: dict[str, DailyQuota] = {}
    for manifest in manifests:
        for destination in manifest.destination_slots:
            profile = manifest.profile(destination.profile)
            quota = quota_of(profile) if profile is not None else None
            if quota is None or profile is None:
                continue
            key = budget_key(destination.remote_scope, profile.credential_ref)
            known = quotas.get(key)
            if known is None or quota.allowance < known.allowance:
                quotas[key] = quota
    return quotas


def waiting_detail(resets_at: datetime) -> str:
    """What the link's details and its step say while it waits."""
    return f"waiting for the daily quota until {resets_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
