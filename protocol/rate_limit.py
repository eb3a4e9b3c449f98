"""Remote request budgets (SPEC PROF-3): which budget a request spends, and how fast.

A budget is one credential on one remote scope: HubSpot counts its burst window
per app and account, whichever profile or process sends. Its key is a short
hash (no credential reference leaves Postgres in clear). The budget's rate is
the smallest `rateLimit` declared by a profile that spends it; a budget no
profile limits has no rate and its requests carry no key.

Enforcement has two parts (PROF-3, NF-8); these functions only decide
the numbers, so they are pure and tested without a server:

- Temporal's matching dispatches a budget's remote activities at its declared rate
  (task-queue fairness keys), so a budget's backlog waits in the task queue, not in
  worker slots, and budgets (tenants) are fair to each other. A bulk `push` and single
  saves use two keys of the budget: Temporal's limiter gives a key's tasks their turns
  in arrival order whatever their priority (measured: a single save queued behind 30
  bulk tasks of its key went last), so a single save needs a key with no queue.
- A slot reserved in Postgres (`db.budget_pace`, a GCRA shared by every worker) caps
  the two keys together at the paced rate: each remote activity waits for its slot
  before it sends. A slot is reserved before the send, so a worker's death can only
  leave a slot unused. An idle budget catches up nothing (`CATCH_UP_S`).

NF-8': a remote's limiter may have no tolerance (HubSpot's counts every request of a
rolling 10 s window), so no window of requests *sent* may exceed the declared limit.
Slots are paced one interval of margin apart per window: L requests take W + W/L, so
any window of W holds at most L slots (floor(L²/(L+1)) + 1 = L) and a send up to about
one interval late still keeps it there; the cost is L/(L+1) of the rate (0.95 at 20
per 10 s, 0.99 at 100, 0.995 at 190).

The earlier rule (Temporal alone, 20 requests of every window kept unused for its
limiter's run-ahead) spent 80% of a 100/10 s limit and half of a 20/10 s one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from pydantic import BaseModel, ConfigDict

from protocol.identity import hash_parts
from protocol.manifest import PackManifest, RateLimit

BUDGET_KEY_PREFIX: Final = "rb1_"
BUDGET_KEY_DOMAIN: Final = b"connector-push/remote-budget/v1\x00"
# How much faster than its slots Temporal dispatches a budget's activities: what runs
# ahead waits for its slot, or past BULK_MAX_PACE_WAIT_S in a workflow timer (two more
# billed actions). Measured at 20 per 10 s, two workers, load 7-9 on 2 cores: 1.0 gave
# 0.94 of the limit, 1.05 gave 0.93 (the machine, not the pacing, decided both).
DISPATCH_AHEAD: Final = 1.0
# An idle budget's catch-up (seconds of its rate sent at once): none, since a strict
# limiter counts a burst after idle against the window it lands in (NF-8').
CATCH_UP_S: Final = 0.0
# How late a sender may wake for its slot and still send, and the longest a remote
# activity waits for its slot (it has 30 s, the HTTP request up to 10): a longer wait is
# spent in a workflow timer instead, without a slot, and the step is tried again. A bulk
# step reserves no further ahead than BULK_MAX_PACE_WAIT_S, so what Temporal's limiter
# dispatched ahead of the pace (measured: ~20 of 40 queued tasks at once) cannot hold
# the slots a single save needs next.
PACE_TOLERANCE_S: Final = 1.0
MAX_PACE_WAIT_S: Final = 12.0
BULK_MAX_PACE_WAIT_S: Final = 2.0
# The fairness key of a budget's single saves: the budget's key and this suffix.
INTERACTIVE_KEY_SUFFIX: Final = ":i"
# Temporal task priority of a link's remote steps (1 runs first; unset is 3): a single
# save's steps go before its own tenant's queued bulk `push` (NF-8). Budgets stay fair
# to each other at each level through their fairness keys.
INTERACTIVE_PRIORITY: Final = 2
BULK_PRIORITY: Final = 4


class RemoteBudget(BaseModel):
    """A budget's fairness key and its pacing rate in requests per second (None: unlimited)."""

    model_config = ConfigDict(frozen=True)

    key: str
    per_second: float | None = None


def budget_key(remote_scope: str, credential_ref: str) -> str:
    """The fairness key of one credential on one remote scope (at most 64 bytes)."""
    return BUDGET_KEY_PREFIX + hash_parts(BUDGET_KEY_DOMAIN, (remote_scope, credential_ref))[:40]


def paced_per_second(limit: RateLimit) -> float:
    """The rate a declared limit is paced at (requests/s): L requests per W + W/L, so no
    window of W holds more than L sends (NF-8', the module's docstring)."""
    return limit.per_second * limit.requests / (limit.requests + 1)


def remote_priority_key(bulk: bool) -> int:
    """The Temporal priority of a link's remote steps: bulk (`push`) after single saves."""
    return BULK_PRIORITY if bulk else INTERACTIVE_PRIORITY


def fairness_key_for(budget_key: str | None, bulk: bool) -> str | None:
    """The fairness key of a link's remote steps: its budget's, single saves apart."""
    if budget_key is None:
        return None
    return budget_key if bulk else budget_key + INTERACTIVE_KEY_SUFFIX


class PaceSlot(BaseModel):
    """Which budget a remote activity spends and the interval between its requests."""

    model_config = ConfigDict(frozen=True)

    budget_key: str
    interval_s: float
    max_wait_s: float


def pace_slot(
    fairness_key: str | None, fairness_weight: float | None, default_per_second: float
) -> PaceSlot | None:
    """The budget and pace of an activity scheduled with this key and weight (its
    weight scales the default rate to the budget's); None: no limited budget."""
    if not fairness_key or not fairness_key.startswith(BUDGET_KEY_PREFIX):
        return None
    per_second = (fairness_weight or 1.0) * default_per_second / DISPATCH_AHEAD
    interactive = fairness_key.endswith(INTERACTIVE_KEY_SUFFIX)
    return PaceSlot(
        budget_key=fairness_key.removesuffix(INTERACTIVE_KEY_SUFFIX),
        interval_s=1 / per_second,
        max_wait_s=MAX_PACE_WAIT_S if interactive else BULK_MAX_PACE_WAIT_S,
    )


# How many slots a sender may miss before it sends late anyway: a process late for
# every wake (an event loop lagging for good) would otherwise hold every send back.
MAX_SLOTS_MISSED: Final = 1


def slot_missed(overslept_s: float) -> bool:
    """Whether a sender that woke `overslept_s` after its slot has missed it: sent now, it
    would land among the slots reserved after its own (a stalled process wakes every
    sender it held at once, a burst the remote's window counts). Within the catch-up an
    idle budget is allowed anyway, it has not."""
    return overslept_s > PACE_TOLERANCE_S


def declared_limits(manifests: Iterable[PackManifest]) -> Iterator[tuple[str, RateLimit]]:
    """(budget key, rateLimit) of every destination whose profile declares one: the walk
    the paced rates and the daily quotas both take (a budget may appear more than once)."""
    for manifest in manifests:
        for destination in manifest.destination_slots:
            profile = manifest.profile(destination.profile)
            if profile is not None and profile.rate_limit is not None:
                key = budget_key(destination.remote_scope, profile.credential_ref)
                yield key, profile.rate_limit


def budget_rates(manifests: Iterable[PackManifest]) -> dict[str, float]:
    """Every limited budget's paced rate (requests/s), the slowest where profiles differ."""
    rates: dict[str, float] = {}
    for key, limit in declared_limits(manifests):
        rate = paced_per_second(limit)
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
    """The weight that scales a key's default rate limit down to the budget's pace (and
    DISPATCH_AHEAD above it)."""
    return per_second * DISPATCH_AHEAD / default_per_second
