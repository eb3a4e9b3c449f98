"""Remote request budgets (SPEC PROF-3): which budget a request spends, and how fast.

A budget is one credential on one remote scope: HubSpot counts its burst window
per app and account, whichever profile or process sends. Its key is a short
hash (no credential reference leaves Postgres in clear). The budget's rate is
the smallest `rateLimit` declared by a profile that spends it; a budget no
profile limits has no rate and its requests carry no key.

Enforcement is Temporal's (task-queue fairness keys); these functions only
decide the numbers, so they are pure and tested without a server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pydantic import BaseModel, ConfigDict

from protocol.identity import hash_parts
from protocol.manifest import PackManifest, RateLimit

BUDGET_KEY_PREFIX: Final = "rb1_"
BUDGET_KEY_DOMAIN: Final = b"connector-push/remote-budget/v1\x00"
# Temporal's fairness limiter lets a key run ahead of its pace: ~7 tasks at the start
# on a quiet dev server, and up to ~16 in one 10 s window when the workers' polls were
# starved on a loaded 2-core machine (measured: 46 in a window paced at 30). Pacing
# leaves that many requests of every declared window unused, so each rolling window
# stays inside the limit; a large window loses little (500 per 10 s paces at 48/s), a
# small one more (40 per 10 s at 2/s). A fixed 85% capped bench P6 at 0.86 of the limit.
BURST_ALLOWANCE: Final = 20
MAX_PACE: Final = 0.98
MIN_PACE: Final = 0.5


class RemoteBudget(BaseModel):
    """A budget's fairness key and its pacing rate in requests per second (None: unlimited)."""

    model_config = ConfigDict(frozen=True)

    key: str
    per_second: float | None = None


def budget_key(remote_scope: str, credential_ref: str) -> str:
    """The fairness key of one credential on one remote scope (at most 64 bytes)."""
    return BUDGET_KEY_PREFIX + hash_parts(BUDGET_KEY_DOMAIN, (remote_scope, credential_ref))[:40]


def paced_per_second(limit: RateLimit) -> float:
    """The rate a declared limit is paced at (requests/s): its window less the burst."""
    share = (limit.requests - BURST_ALLOWANCE) / limit.requests
    return limit.per_second * min(MAX_PACE, max(MIN_PACE, share))


def budget_rates(manifests: Iterable[PackManifest]) -> dict[str, float]:
    """Every limited budget's paced rate (requests/s), the slowest where profiles differ."""
    rates: dict[str, float] = {}
    for manifest in manifests:
        for destination in manifest.destination_slots:
            profile = manifest.profile(destination.profile)
            if profile is None or profile.rate_limit is None:
                continue
            key = budget_key(destination.remote_scope, profile.credential_ref)
            rate = paced_per_second(profile.rate_limit)
            rates[key] = min(rate, rates.get(key, rate))
    return rates


def destination_budget(
    manifests: Iterable[PackManifest], manifest: PackManifest, destination_slot_id: str
) -> RemoteBudget | None:
    """The budget a destination spends, rated across every manifest in `manifests`."""
    destination = manifest.destination_slot(destination_slot_id)
    profile = manifest.profile(destination.profile) if destination else None
    if destination is None or profile is None:
        return None
    key = budget_key(destination.remote_scope, profile.credential_ref)
    return RemoteBudget(key=key, per_second=budget_rates(manifests).get(key))


class RemoteBudgetInput(BaseModel):
    """Which budget the link's remote requests spend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    link_key: str


class RemoteBudgetResult(BaseModel):
    """The fairness key and weight to schedule remote activities with; None: no limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fairness_key: str | None = None
    fairness_weight: float | None = None


def budget_result(
    key: str, rates: dict[str, float], default_per_second: float
) -> RemoteBudgetResult:
    """The fairness key and weight for budget `key` under `rates`; no key when unlimited."""
    per_second = rates.get(key)
    if per_second is None:
        return RemoteBudgetResult()
    weight = fairness_weight(per_second, default_per_second)
    return RemoteBudgetResult(fairness_key=key, fairness_weight=weight)


def fairness_weight(per_second: float, default_per_second: float) -> float:
    """The weight that scales a key's default rate limit down to the budget's pace."""
    return per_second / default_per_second
