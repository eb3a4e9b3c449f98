"""Remote budgets (SPEC PROF-3): which key a destination spends and at what rate."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.manifest import ManifestInvalid, RateLimit
from protocol.rate_limit import (
    BULK_MAX_PACE_WAIT_S,
    DISPATCH_AHEAD,
    budget_key,
    budget_rates,
    destination_budget,
    fairness_key_for,
    fairness_weight,
    pace_slot,
    paced_per_second,
    remote_priority_key,
)
from tests.unit.factories import demo_manifest


def _limit(profile: int, requests: int, per_seconds: float = 10) -> Any:
    def mutate(doc: dict[str, Any]) -> None:
        for p in doc["profiles"]:
            p.pop("rateLimit", None)
        doc["profiles"][profile]["rateLimit"] = {"requests": requests, "perSeconds": per_seconds}

    return mutate


def test_the_demo_profiles_share_one_budget_at_the_declared_rate() -> None:
    manifest = demo_manifest()
    budgets = {
        d.id: destination_budget([manifest], manifest, d.id) for d in manifest.destination_slots
    }

    keys = {b.key for b in budgets.values() if b is not None}
    assert keys == {budget_key("sandbox-portal", "env:SANDBOX_TOKEN")}
    # Only one profile declares the limit (100 per 10 s), paced one interval of margin below
    # its 10/s (NF-8'); the others spend the same credential.
    assert {b.per_second for b in budgets.values() if b is not None} == {10.0 * 100 / 101}


def test_the_smallest_declared_limit_wins_for_a_shared_budget() -> None:
    manifest = demo_manifest(_limit(0, 100))
    other = demo_manifest(_limit(1, 20)).model_copy(update={"connector_owner_key": "other"})

    # 20 per 10 s: 2/s less its margin, slower than 100 per 10 s.
    assert budget_rates([manifest, other]) == {
        budget_key("sandbox-portal", "env:SANDBOX_TOKEN"): 2.0 * 20 / 21
    }


def test_a_budget_no_profile_limits_has_no_rate() -> None:
    def unlimited(doc: dict[str, Any]) -> None:
        for p in doc["profiles"]:
            p.pop("rateLimit", None)

    manifest = demo_manifest(unlimited)
    budget = destination_budget([manifest], manifest, "remote-deals")

    assert budget is not None and budget.per_second is None
    assert destination_budget([manifest], manifest, "no-such-slot") is None


def test_keys_differ_by_scope_and_credential_and_fit_temporal() -> None:
    key = budget_key("portal-1", "env:A")

    assert key != budget_key("portal-2", "env:A") != budget_key("portal-1", "env:B")
    assert "env:A" not in key and len(key.encode()) <= 64  # Temporal's fairness-key bound


def test_the_weight_scales_the_default_rate_to_the_paced_rate() -> None:
    assert fairness_weight(10.0, 1000.0) == pytest.approx(10.0 * DISPATCH_AHEAD / 1000.0)


@pytest.mark.parametrize(
    ("requests", "per_seconds"), [(20, 10), (100, 10), (190, 10), (5, 1), (1, 10)]
)
def test_no_window_of_paced_sends_exceeds_the_declared_limit(
    requests: int, per_seconds: float
) -> None:
    """NF-8': against a limiter with no tolerance, slots one paced interval apart put at
    most `requests` in any window of `per_seconds`, whatever its alignment, and spend at
    least 95% of the declared rate from 20 requests up (a margin of one interval)."""
    limit = RateLimit(requests=requests, per_seconds=per_seconds)
    interval = 1 / paced_per_second(limit)
    slots = [i * interval for i in range(requests * 5)]
    # The busiest window starts at a slot: count every slot in [slot, slot + window).
    worst = max(sum(1 for t in slots if s <= t < s + per_seconds) for s in slots)
    assert worst == requests
    if requests >= 20:
        assert paced_per_second(limit) >= 0.95 * limit.per_second
    # A send that leaves up to one declared interval late (a slow wake, a slow connect)
    # still keeps every window within the limit; at the whole declared rate, any delay
    # at all puts limit + 1 in the window that ends at the next `requests`th send.
    declared_interval = per_seconds / requests
    assert (
        _worst_window(_one_late(interval, requests, 0.9 * declared_interval), per_seconds)
        <= requests
    )
    whole = 1 / limit.per_second
    assert _worst_window(_one_late(whole, requests, 0.01 * whole), per_seconds) == requests + 1


def _one_late(interval: float, requests: int, delay: float) -> list[float]:
    return [delay] + [i * interval for i in range(1, requests * 3)]


def _worst_window(times: list[float], window: float) -> int:
    """The most sends in any window (end - window, end] a strict limiter counts."""
    return max(sum(1 for t in times if end - window < t <= end) for end in times)


def test_single_saves_and_bulk_pushes_spend_one_budget_under_two_keys() -> None:
    key = budget_key("portal-1", "env:A")
    bulk, single = fairness_key_for(key, bulk=True), fairness_key_for(key, bulk=False)

    assert bulk == key and single is not None and single != key
    assert len(single.encode()) <= 64  # Temporal's fairness-key bound
    assert fairness_key_for(None, bulk=False) is None  # an unlimited budget has no key
    weight = fairness_weight(2.0, 1000.0)
    slots = [pace_slot(k, weight, 1000.0) for k in (bulk, single)]
    assert {s.budget_key for s in slots if s} == {key}  # one slot sequence for both
    assert all(s is not None and s.interval_s == pytest.approx(0.5) for s in slots)
    # A bulk step may not hold slots far ahead: what a single save needs next stays free.
    assert slots[0] is not None and slots[1] is not None
    assert slots[0].max_wait_s == BULK_MAX_PACE_WAIT_S < slots[1].max_wait_s
    assert remote_priority_key(bulk=False) < remote_priority_key(bulk=True)  # 1 runs first


def test_an_activity_without_a_budget_key_is_not_paced() -> None:
    assert pace_slot(None, None, 1000.0) is None
    assert pace_slot("tenant-a", 0.5, 1000.0) is None  # not a budget's key


@pytest.mark.parametrize(
    ("rate_limit", "message"),
    [
        ({"requests": 0, "perSeconds": 10}, "profiles[0].rateLimit.requests"),
        ({"requests": 10, "perSeconds": 0}, "profiles[0].rateLimit.perSeconds"),
        ({"requests": 10}, "profiles[0].rateLimit.perSeconds"),
        ({"requests": 10, "perSeconds": 10, "burst": 5}, "profiles[0].rateLimit.burst"),
    ],
)
def test_an_invalid_rate_limit_names_the_field(rate_limit: dict[str, Any], message: str) -> None:
    def mutate(doc: dict[str, Any]) -> None:
        doc["profiles"][0]["rateLimit"] = rate_limit

    with pytest.raises(ManifestInvalid) as info:
        demo_manifest(mutate)
    assert message in str(info.value)
