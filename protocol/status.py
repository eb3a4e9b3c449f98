"""The operator's status view (what waits, and why): one snapshot, two renderings.

`connector-push status` draws a `StatusSnapshot` as a dashboard and the worker
publishes the same snapshot as Prometheus gauges (`gauges`), so the terminal and
the metrics endpoint can never disagree about a number.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, computed_field

# Rates are counted over this window and reported per minute.
RATE_WINDOW_SECONDS: Final = 300
GAUGE_PREFIX: Final = "connector_push_status_"


class OldestParked(BaseModel):
    model_config = ConfigDict(frozen=True)

    link_key: str
    reason: str
    since: datetime


class DailyQuotaDay(BaseModel):
    """One budget's daily quota today (NF-8): spent of its allowance (the declared
    share of the quota; None when none is declared), and when the day resets."""

    model_config = ConfigDict(frozen=True)

    budget_key: str
    day: date
    spent: int
    allowance: int | None
    resets_at: datetime
    refused_by_remote: bool = False  # a 429 named the remote's daily policy

    @computed_field  # type: ignore[prop-decorator]
    @property
    def waiting(self) -> bool:
        """Pushes under this budget wait for `resets_at` (not parked, not failed)."""
        spent = self.allowance is not None and self.spent >= self.allowance
        return spent or self.refused_by_remote


class StatusSnapshot(BaseModel):
    """What Postgres says now; counts by label, rates per minute over `RATE_WINDOW_SECONDS`."""

    model_config = ConfigDict(frozen=True)

    taken_at: datetime
    links_by_state: dict[str, int] = Field(default_factory=dict)
    # ambiguous_remote_effect / terminal_failed attempts, patch_outcome_unknown PATCHes.
    parked_by_reason: dict[str, int] = Field(default_factory=dict)
    # suspend_reason of suspended links: drift:<surface>, remote_deleted, remote_conflict...
    suspended_by_surface: dict[str, int] = Field(default_factory=dict)
    pending_attempts: int = 0
    pending_patches: int = 0
    creates_per_minute: float = 0.0
    patches_per_minute: float = 0.0
    ingress_admissions_per_minute: float = 0.0
    # Counted by the ingress processes, not Postgres: None when no ingress was asked.
    ingress_unavailable_total: int | None = None
    oldest_parked: OldestParked | None = None
    # Budgets with a declared daily quota (or refused by the remote) whose day has not reset.
    daily_quotas: list[DailyQuotaDay] = Field(default_factory=list)

    @property
    def parked_total(self) -> int:
        return sum(self.parked_by_reason.values())


Gauge = tuple[str, dict[str, str], float]


def gauges(s: StatusSnapshot, now: datetime) -> list[Gauge]:
    """The snapshot as (gauge name, labels, value); label values come from our own enums
    and stored reasons, never from request data."""
    out: list[Gauge] = [
        (f"{GAUGE_PREFIX}links", {"state": k}, v) for k, v in s.links_by_state.items()
    ]
    out += [(f"{GAUGE_PREFIX}parked", {"reason": k}, v) for k, v in s.parked_by_reason.items()]
    out += [
        (f"{GAUGE_PREFIX}suspended", {"surface": k}, v) for k, v in s.suspended_by_surface.items()
    ]
    out += [
        (f"{GAUGE_PREFIX}queue_depth", {"kind": "attempt"}, s.pending_attempts),
        (f"{GAUGE_PREFIX}queue_depth", {"kind": "patch"}, s.pending_patches),
        (f"{GAUGE_PREFIX}per_minute", {"kind": "create"}, s.creates_per_minute),
        (f"{GAUGE_PREFIX}per_minute", {"kind": "patch"}, s.patches_per_minute),
        (
            f"{GAUGE_PREFIX}per_minute",
            {"kind": "ingress_admission"},
            s.ingress_admissions_per_minute,
        ),
    ]
    age = (now - s.oldest_parked.since).total_seconds() if s.oldest_parked else 0.0
    out.append((f"{GAUGE_PREFIX}oldest_parked_age_seconds", {}, max(age, 0.0)))
    for d in s.daily_quotas:  # the budget key is a hash: no credential in a label
        budget = {"budget": d.budget_key}
        out.append((f"{GAUGE_PREFIX}daily_quota_spent", budget, d.spent))
        if d.allowance is not None:
            out.append((f"{GAUGE_PREFIX}daily_quota_allowance", budget, d.allowance))
        out.append((f"{GAUGE_PREFIX}daily_quota_waiting", budget, float(d.waiting)))
    return out
