"""Remote budgets (SPEC PROF-3, NF-8'): which key a destination spends, at what rate its
slots are paced, and the send window that bounds what reaches the remote."""

from __future__ import annotations

import random
from typing import Any

import pytest

from protocol.manifest import ManifestInvalid, RateLimit
from protocol.rate_limit import (
    BULK_MAX_PACE_WAIT_S,
    DISPATCH_AHEAD,
    MAX_PACE_WAIT_S,
    MAX_WINDOW_REQUESTS,
    PACE_MARGIN_S,
    PACE_TOLERANCE_S,
    SEND_WINDOW_MARGIN_S,
    SendWindow,
    budget_key,
    budget_rates,
    budget_windows,
    destination_budget,
    fairness_key_for,
    fairness_weight,
    pace_slot,
    paced_per_second,
    remote_priority_key,
    send_window,
    window_allows,
    window_wait_allowance,
)
from protocol.timeouts import REMOTE_HTTP_TIMEOUT, REQUEST_DEADLINE_MARGIN
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
    # Only one profile declares the limit (100 per 10 s), its slots paced at 100 per
    # 10 s + PACE_MARGIN_S (NF-8'); the others spend the same credential.
    assert {b.per_second for b in budgets.values() if b is not None} == {100 / (10 + PACE_MARGIN_S)}


def test_the_smallest_declared_limit_wins_for_a_shared_budget() -> None:
    manifest = demo_manifest(_limit(0, 100))
    other = demo_manifest(_limit(1, 20)).model_copy(update={"connector_owner_key": "other"})

    # 20 per 10 s, slower than 100 per 10 s: its rate and its send window both.
    key = budget_key("sandbox-portal", "env:SANDBOX_TOKEN")
    assert budget_rates([manifest, other]) == {key: 20 / (10 + PACE_MARGIN_S)}
    assert budget_windows([manifest, other]) == {
        key: SendWindow(requests=20, span_s=10 + SEND_WINDOW_MARGIN_S)
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
def test_slots_are_paced_below_the_send_window(requests: int, per_seconds: float) -> None:
    """The slots alone put at most `requests` in any window of `per_seconds` when every
    sender is on time, at >= 95% of a 10 s limit, and slower than the send window lets
    through, so a lateness the window passes on drains (protocol.rate_limit)."""
    limit = RateLimit(requests=requests, per_seconds=per_seconds)
    interval = 1 / paced_per_second(limit)
    slots = [i * interval for i in range(requests * 5)]
    assert _worst_window(slots, per_seconds) <= requests
    if per_seconds >= 10:
        assert paced_per_second(limit) >= 0.95 * limit.per_second
    window = send_window(limit)
    assert paced_per_second(limit) < window.requests / window.span_s


@pytest.mark.parametrize(("requests", "per_seconds"), [(20, 10), (40, 10), (100, 10), (190, 10)])
def test_no_window_of_arrivals_exceeds_the_limit_however_late_the_senders(
    requests: int, per_seconds: float
) -> None:
    """NF-8': senders wake for their slots up to the slot rule's tolerance late (the
    bunching that put 21 in a window of 20), take their turns in the send window, and
    arrive up to SEND_WINDOW_MARGIN_S after their records: no window of `per_seconds` at
    the remote holds more than `requests`. Sent at their wakes (the slot rule), some do."""
    limit = RateLimit(requests=requests, per_seconds=per_seconds)
    rng = random.Random(requests)
    interval, late_by = 1 / paced_per_second(limit), PACE_TOLERANCE_S * per_seconds / 10
    wakes = sorted(i * interval + rng.choice((0.0, late_by)) for i in range(requests * 6))
    sent = _turns(wakes, send_window(limit))
    arrivals = [t + rng.uniform(0, SEND_WINDOW_MARGIN_S) for t in sent]

    assert _worst_window(arrivals, per_seconds) <= requests
    assert _worst_window(wakes, per_seconds) > requests
    assert len(sent) == len(wakes)


def _turns(wakes: list[float], window: SendWindow) -> list[float]:
    """Each sender, in wake order, goes at its wake or, when the window holds L already,
    as the L-th newest ages out (after the sender before it: turns go in order)."""
    sent: list[float] = []
    for wake in wakes:
        at = max([wake, *sent[-1:]])
        if not window_allows(sent, at, window):
            at = sent[len(sent) - window.requests] + window.span_s + 1e-9
        assert window_allows(sent, at, window)
        sent.append(at)
    return sent


def test_a_limit_over_the_longest_window_is_held_to_a_proportional_part_of_it() -> None:
    """A budget keeps its last L send instants; past MAX_WINDOW_REQUESTS it keeps a
    fraction of L over the same fraction of W, which bounds every whole W too."""
    assert send_window(RateLimit(requests=190, per_seconds=10)) == SendWindow(
        requests=190, span_s=10 + SEND_WINDOW_MARGIN_S
    )
    window = send_window(RateLimit(requests=2500, per_seconds=60))
    assert window.requests == 833 and window.span_s == pytest.approx(20 + SEND_WINDOW_MARGIN_S)
    assert window.requests * 3 <= 2500 <= MAX_WINDOW_REQUESTS * 3


def test_a_request_waits_for_its_turn_only_while_a_whole_timeout_is_left() -> None:
    """G-7: the window turn never eats into the request's own timeout or the margin
    that records its answer; outside an activity, up to MAX_PACE_WAIT_S."""
    whole = REMOTE_HTTP_TIMEOUT.total_seconds() + REQUEST_DEADLINE_MARGIN.total_seconds()
    assert window_wait_allowance(None) == MAX_PACE_WAIT_S
    assert window_wait_allowance(whole + 4.0) == pytest.approx(4.0)
    assert window_wait_allowance(whole + 60.0) == MAX_PACE_WAIT_S
    assert window_wait_allowance(whole - 1.0) == 0.0


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
