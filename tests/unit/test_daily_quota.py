"""Daily quotas (issue 33 item 3): the allowance, the quota day and its reset, the pack
fields' validation (the declared daily-limit answer: test_answer_rules_prof5.py).
Pure: `now` is passed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.daily_quota import (
    RESET_MARGIN_S,
    budget_quotas,
    next_reset,
    quota_day,
    wait_seconds,
)
from protocol.manifest import ManifestInvalid, daily_allowance
from protocol.rate_limit import budget_key
from tests.unit.factories import demo_manifest

KEY = budget_key("sandbox-portal", "env:SANDBOX_TOKEN")


def _daily(profile: int, **fields: Any) -> Any:
    def mutate(doc: dict[str, Any]) -> None:
        limit = {"requests": 100, "perSeconds": 10, **fields}
        doc["profiles"][profile]["rateLimit"] = limit

    return mutate


@pytest.mark.parametrize(
    ("quota", "share", "allowance"),
    [(10, 0.5, 5), (10, 0.3, 3), (250_000, 0.5, 125_000), (3, 0.5, 1), (7, 1.0, 7)],
)
def test_the_allowance_is_the_share_rounded_down(quota: int, share: float, allowance: int) -> None:
    assert daily_allowance(quota, share) == allowance


@given(quota=st.integers(1, 10_000_000), share=st.floats(0.001, 1.0))
def test_the_allowance_never_exceeds_the_share(quota: int, share: float) -> None:
    allowance = daily_allowance(quota, share)
    assert allowance <= quota * share + 1e-6
    assert allowance > quota * share - 1


@given(
    instant=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
    zone=st.sampled_from(["UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata"]),
)
def test_the_reset_is_the_next_local_midnight_and_starts_the_next_day(
    instant: datetime, zone: str
) -> None:
    reset = next_reset(instant, zone)
    local = reset.astimezone(ZoneInfo(zone))

    assert instant < reset <= instant + timedelta(hours=25)  # a DST day is 25 hours long
    assert (local.hour, local.minute) == (0, 0)
    assert quota_day(reset, zone) == quota_day(instant, zone) + timedelta(days=1)
    assert quota_day(reset - timedelta(microseconds=1), zone) == quota_day(instant, zone)


def test_the_day_is_the_reset_zones_date() -> None:
    # 03:00 UTC is still the previous evening in New York (UTC-5 in January).
    now = datetime(2026, 1, 10, 3, 0, tzinfo=UTC)

    assert str(quota_day(now, "UTC")) == "2026-01-10"
    assert str(quota_day(now, "America/New_York")) == "2026-01-09"
    assert next_reset(now, "America/New_York") == datetime(2026, 1, 10, 5, 0, tzinfo=UTC)


def test_a_run_waits_until_just_after_the_reset_or_rechecks_sooner() -> None:
    now = datetime(2026, 1, 10, 23, 0, tzinfo=UTC)
    reset = next_reset(now, "UTC")

    assert wait_seconds(now, reset) == 3600 + RESET_MARGIN_S
    assert wait_seconds(now, reset, recheck_s=1.0) == 1.0
    assert wait_seconds(reset + timedelta(seconds=5), reset) == RESET_MARGIN_S


def test_a_budget_gets_the_smallest_allowance_declared_for_it() -> None:
    one = demo_manifest(_daily(0, dailyQuota=10, dailyShare=0.5))

    def berlin(doc: dict[str, Any]) -> None:
        _daily(1, dailyQuota=100, dailyShare=0.02)(doc)
        doc["profiles"][1]["dailyLimit"]["reset"] = {"timeZone": "Europe/Berlin"}  # PROF-5

    other = demo_manifest(berlin).model_copy(update={"connector_owner_key": "other"})
    plain = demo_manifest()

    assert budget_quotas([plain]) == {}
    assert budget_quotas([one])[KEY].allowance == 5
    chosen = budget_quotas([one, other])[KEY]
    assert (chosen.allowance, chosen.time_zone) == (2, "Europe/Berlin")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dailyShare": 0.5}, "dailyShare and dailyResetTimeZone need a dailyQuota"),
        ({"dailyQuota": 10, "dailyShare": 0}, "dailyShare: Input should be greater than 0"),
        ({"dailyQuota": 10, "dailyShare": 1.5}, "dailyShare: Input should be less than or equal"),
        ({"dailyQuota": 0}, "dailyQuota: Input should be greater than or equal to 1"),
        ({"dailyQuota": 1, "dailyShare": 0.5}, "allows no request a day"),
        ({"dailyQuota": 10, "dailyResetTimeZone": "Mars/Olympus"}, "not an IANA time zone"),
    ],
)
def test_the_pack_refuses_a_quota_it_cannot_keep(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestInvalid) as info:
        demo_manifest(_daily(0, **fields))
    assert message in str(info.value)
    assert "profiles[0].rateLimit" in str(info.value) or "profiles.0.rateLimit" in str(info.value)
