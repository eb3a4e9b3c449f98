"""Remote request budgets (SPEC PROF-3): which budget a request spends, and how fast.

A budget is one credential on one remote scope: HubSpot counts its burst window
per app and account, whichever profile or process sends. Its key is a short
hash (no credential reference leaves Postgres in clear). The budget's rate is
the smallest `rateLimit` declared by a profile that spends it; a budget no
profile limits has no rate and its requests carry no key.

Enforcement has three parts (PROF-3, NF-8, NF-8'); these functions only decide
the numbers, so they are pure and tested without a server:

- Temporal's matching dispatches a budget's remote activities at its declared rate
  (task-queue fairness keys), so a budget's backlog waits in the task queue, not in
  worker slots, and budgets (tenants) are fair to each other. A bulk `push` and single
  saves use two keys of the budget: Temporal's limiter gives a key's tasks their turns
  in arrival order whatever their priority (measured: a single save queued behind 30
  bulk tasks of its key went last), so a single save needs a key with no queue.
- A slot reserved in Postgres (`db.budget_pace`, a GCRA shared by every worker) spaces
  the two keys' activities together at the paced rate: each remote activity waits for
  its slot before it claims its send. This is smoothness, not the bound: a slot is
  reserved ahead of the send, and senders that wake late for theirs (a stalled event
  loop, a starved CPU) send together (21 in a 10 s window of a 20 budget, bench P6
  under load 7.9).
- The bound is the send window (NF-8'), checked where each request leaves
  (`services.remote.send`, every POST, PATCH, look-up and read-back GET): in one
  statement under the budget's row lock, a request may go at t only if fewer than L of
  the budget's requests were recorded in (t - W - SEND_WINDOW_MARGIN_S, t], and it is
  recorded at t (the budget keeps its last L send instants). Every request arrives at
  most SEND_WINDOW_MARGIN_S after its record, so any L + 1 arrivals span more than W:
  no window of W at the remote holds more than L. A request that cannot get its turn
  while its activity keeps a whole request timeout after it (G-7) is not sent
  (`not_sent`, tried again like any request that never left).

The window of a budget allows L per W + SEND_WINDOW_MARGIN_S; the slots are paced at L
per W + PACE_MARGIN_S, a little slower, so a lateness the window check passed on to the
next senders drains instead of lasting: the cost is W/(W + PACE_MARGIN_S) of the
declared rate (0.96 at any L for a 10 s window).

An idle budget catches up nothing (`CATCH_UP_S`): the window would allow L at once,
the slots space them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict

from protocol.identity import hash_parts
from protocol.manifest import PackManifest, RateLimit
from protocol.timeouts import REMOTE_HTTP_TIMEOUT, REQUEST_DEADLINE_MARGIN

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
# The gap the send window allows between a request's record (Postgres's clock, in the
# statement that grants its turn) and its arrival at the remote's limiter: the answer
# reaching the sender's event loop, the HTTP client's connection and write, the remote's
# parsing before it counts. Local sends take milliseconds; under load 8 on two cores an
# event loop resumes a task tens to a couple of hundred ms late, and a real remote's
# network jitter is tens of ms on a kept-alive connection. Requests that arrive within W
# of each other were recorded within W + margin of each other, so no remote window
# exceeds L while no request arrives later than this after its record; a larger margin
# costs rate (a window allows L per W + margin: 0.98 of a 10 s limit at 0.2 s).
SEND_WINDOW_MARGIN_S: Final = 0.2
# The slots' pace: L per W + this, a margin past the window's own so that a lateness the
# window check carried over to the next senders (each sender may go no earlier than the
# L-th before it, plus W + margin) drains by this much less SEND_WINDOW_MARGIN_S per L
# sends; less would hold it for good, more costs rate (W / (W + this): 0.96 at 10 s).
PACE_MARGIN_S: Final = 2 * SEND_WINDOW_MARGIN_S
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
    """The rate a declared limit's slots are paced at (requests/s): L requests per
    W + PACE_MARGIN_S, a little slower than its send window allows (the module's
    docstring)."""
    window = send_window(limit)
    return window.requests / (window.span_s - SEND_WINDOW_MARGIN_S + PACE_MARGIN_S)


# The longest send window a budget keeps (its last L send instants, in one row): a larger
# limit is held to the same fraction of a proportionally shorter window, which bounds
# every window of the declared length too (k whole sub-windows of W/k, at most L/k each).
MAX_WINDOW_REQUESTS: Final = 1000


class SendWindow(BaseModel):
    """A budget's send window (NF-8'): at most `requests` in any `span_s` (W +
    SEND_WINDOW_MARGIN_S), counted where each request leaves."""

    model_config = ConfigDict(frozen=True)

    requests: int
    span_s: float


def send_window(limit: RateLimit) -> SendWindow:
    """The send window that keeps every W of a declared limit at most L at the remote."""
    parts = -(-limit.requests // MAX_WINDOW_REQUESTS)  # ceil: 1 up to the cap
    return SendWindow(
        requests=limit.requests // parts,
        span_s=limit.per_seconds / parts + SEND_WINDOW_MARGIN_S,
    )


def window_allows(sent: Sequence[float], at: float, window: SendWindow) -> bool:
    """The send window's rule (`db.budget_pace.TAKE_SEND_TURN` applies it in Postgres):
    a request may leave at `at` when fewer than L of the budget's requests were recorded
    in the span before it (`sent`: the recorded instants, oldest first)."""
    if len(sent) < window.requests:
        return True
    return sent[len(sent) - window.requests] <= at - window.span_s


def window_wait_allowance(time_left_s: float | None) -> float:
    """How long a request may wait for its send window turn (G-7): never into its own
    timeout nor the margin that records its answer, and at most MAX_PACE_WAIT_S. Zero:
    it goes now if the window allows, or not at all (`not_sent`)."""
    cap = MAX_PACE_WAIT_S
    if time_left_s is None:
        return cap
    spare = time_left_s - REQUEST_DEADLINE_MARGIN.total_seconds()
    return max(0.0, min(cap, spare - REMOTE_HTTP_TIMEOUT.total_seconds()))


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
    sender it held at once). The send window still bounds such a burst (it waits its
    turn there); reserving again keeps the pace smooth. Within the tolerance, it has not."""
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


def budget_limits(manifests: Iterable[PackManifest]) -> dict[str, RateLimit]:
    """Every limited budget's declared limit, the slowest where profiles differ (the
    fewer requests at an equal rate: the tighter burst)."""
    limits: dict[str, RateLimit] = {}
    for key, limit in declared_limits(manifests):
        held = limits.get(key)
        if held is None or (limit.per_second, limit.requests) < (held.per_second, held.requests):
            limits[key] = limit
    return limits


def budget_rates(manifests: Iterable[PackManifest]) -> dict[str, float]:
    """Every limited budget's paced rate (requests/s), the slowest where profiles differ."""
    return {key: paced_per_second(limit) for key, limit in budget_limits(manifests).items()}


def budget_windows(manifests: Iterable[PackManifest]) -> dict[str, SendWindow]:
    """Every limited budget's send window, of the same limit its rate is paced at."""
    return {key: send_window(limit) for key, limit in budget_limits(manifests).items()}


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
