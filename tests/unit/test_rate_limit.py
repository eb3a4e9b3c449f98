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
    # Only one profile declares the limit (100 per 10 s), paced at its 10/s; the others
    # spend the same credential.
    assert {b.per_second for b in budgets.values() if b is not None} == {10.0}


def test_the_smallest_declared_limit_wins_for_a_shared_budget() -> None:
    manifest = demo_manifest(_limit(0, 100))
    other = demo_manifest(_limit(1, 20)).model_copy(update={"connector_owner_key": "other"})

    # 20 per 10 s: 2/s, slower than 100 per 10 s.
    assert budget_rates([manifest, other]) == {
        budget_key("sandbox-portal", "env:SANDBOX_TOKEN"): 2.0
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
    ("requests", "per_seconds", "paced"),
    [(20, 10, 2.0), (100, 10, 10.0), (190, 10, 19.0), (40, 10, 4.0), (5, 1, 5.0)],
)
def test_a_budget_is_paced_at_its_whole_declared_rate(
    requests: int, per_seconds: float, paced: float
) -> None:
    # NF-8: the earlier rule kept 20 requests of every window back (half of 20 per 10 s).
    assert paced_per_second(RateLimit(requests=requests, per_seconds=per_seconds)) == paced


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
