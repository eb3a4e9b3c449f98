"""Remote budgets (SPEC PROF-3): which key a destination spends and at what rate."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.manifest import ManifestInvalid, RateLimit
from protocol.rate_limit import (
    BURST_ALLOWANCE,
    budget_key,
    budget_rates,
    destination_budget,
    fairness_weight,
    paced_per_second,
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
    # Only one profile declares the limit (100 per 10 s), paced at 8/s (20 kept for the
    # limiter's burst); the others spend the same credential.
    assert {b.per_second for b in budgets.values() if b is not None} == {8.0}


def test_the_smallest_declared_limit_wins_for_a_shared_budget() -> None:
    manifest = demo_manifest(_limit(0, 100))
    other = demo_manifest(_limit(1, 20)).model_copy(update={"connector_owner_key": "other"})

    # 20 per 10 s paces at half its rate (the floor): 1/s, slower than 100 per 10 s.
    assert budget_rates([manifest, other]) == {
        budget_key("sandbox-portal", "env:SANDBOX_TOKEN"): 1.0
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
    assert fairness_weight(10.0, 1000.0) == pytest.approx(10.0 / 1000.0)


@pytest.mark.parametrize(
    ("requests", "per_seconds", "paced"),
    [
        (500, 10, 48.0),  # bench P6: 0.96 of 50/s
        (100, 10, 8.0),
        (40, 10, 2.0),  # the floor: half the rate
        (50, 1, 30.0),
        (5, 1, 2.5),
        (10_000, 10, 980.0),  # the ceiling: 0.98
    ],
)
def test_pacing_keeps_the_limiters_burst_inside_every_window(
    requests: int, per_seconds: float, paced: float
) -> None:
    limit = RateLimit(requests=requests, per_seconds=per_seconds)
    assert paced_per_second(limit) == pytest.approx(paced)
    burst = BURST_ALLOWANCE
    assert paced * per_seconds + min(burst, requests / 2) <= requests


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
