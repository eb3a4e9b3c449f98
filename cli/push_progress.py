"""What `connector-push push` has done so far, and how long the rest takes at the budget's
pace (NF-8).

On a terminal the line is a live display; otherwise (a job's log, a pipe) it is written
to stderr as a plain line every `PROGRESS_INTERVAL_S`, so an initial sync that runs for
hours shows where it is. stdout keeps only the final summary (one JSON document with
`--json`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Final, TextIO

from protocol.states import AttemptStatus

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    import asyncpg

PARKED: Final = (AttemptStatus.AMBIGUOUS_REMOTE_EFFECT, AttemptStatus.TERMINAL_FAILED)
IN_FLIGHT: Final = (
    AttemptStatus.PENDING,
    AttemptStatus.PROCESSING,
    AttemptStatus.POST_SENT,
    AttemptStatus.WRITEBACK_PENDING,
)

# How often a plain progress line is written when stderr is not a terminal (`--progress-every`).
PROGRESS_INTERVAL_S: Final = 5.0


@dataclass
class Tally:
    """What this run did so far; read by the progress line and the summary."""

    started: float = field(default_factory=time.monotonic)
    # The server's clock when the run began: its attempts are the slot's created since.
    since: datetime | None = None
    admitted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    skipped_linked: int = 0
    skipped_active: int = 0
    observed_active: int = 0
    not_found: list[str] = field(default_factory=list)
    wake_deferred: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    # While admission waits for the budget (NF-8): how many of the run's saves are in flight.
    paced_at: int | None = None

    @property
    def elapsed_s(self) -> float:
        return max(time.monotonic() - self.started, 1e-6)

    @property
    def rate(self) -> float:
        return self.admitted / self.elapsed_s

    def count(self, *statuses: AttemptStatus) -> int:
        return sum(self.statuses.get(s.value, 0) for s in statuses)

    @property
    def settled(self) -> bool:
        """Every attempt of the slot since the run began is out of flight (none is pending,
        processing or writing back), and as many settled as this run admitted."""
        if self.count(*IN_FLIGHT):
            return False
        return (
            self.count(AttemptStatus.FINALIZED, AttemptStatus.SUPERSEDED, *PARKED) >= self.admitted
        )

    @property
    def considered(self) -> int:
        """Records this run has decided on (admitted, rejected or skipped)."""
        return (
            self.admitted
            + sum(self.rejected.values())
            + self.skipped_linked
            + self.skipped_active
            + self.observed_active
        )

    def summary(self) -> dict[str, object]:
        return {
            "admitted": self.admitted,
            "finalized": self.count(AttemptStatus.FINALIZED),
            "parked": self.count(*PARKED),
            "rejected": sum(self.rejected.values()),
            "rejected_by_reason": dict(self.rejected),
            "skipped_already_linked": self.skipped_linked,
            "skipped_active_attempt": self.skipped_active + self.observed_active,
            "not_found": self.not_found,
            "wake_deferred": self.wake_deferred,
            "admitted_per_s": round(self.rate, 1),
            "elapsed_s": round(time.monotonic() - self.started, 2),
            "interrupted": self.interrupted,
        }

    def line(self) -> str:
        s = self.summary()
        return (
            f"admitted {s['admitted']} · finalized {s['finalized']} · parked {s['parked']} · "
            f"rejected {s['rejected']} · skipped {self.skipped_linked} linked, "
            f"{s['skipped_active_attempt']} active · {self.rate:.1f} admitted/s"
        )


@dataclass(frozen=True)
class Scope:
    """How much this run may still have to do, and how fast its budget lets it."""

    records: int  # live records in scope (the named ones, or all of the object)
    limit: int | None  # --limit
    per_second: float | None  # the budget's paced rate (PROF-3); None: no limit declared

    def saves_left(self, tally: Tally) -> int:
        """Saves still to reach the remote: admitted ones not settled, plus records not
        considered yet (an upper bound: some of those may turn out linked already)."""
        to_consider = max(self.records - tally.considered, 0)
        if self.limit is not None:
            to_consider = min(to_consider, max(self.limit - tally.admitted, 0))
        settled = tally.count(AttemptStatus.FINALIZED, *PARKED)
        return to_consider + max(tally.admitted - settled, 0)


def duration(seconds: float) -> str:
    """`~1h05m`, `~4m10s`, `~12s`."""
    s = round(seconds)
    if s >= 3600:
        return f"~{s // 3600}h{s % 3600 // 60:02}m"
    if s >= 60:
        return f"~{s // 60}m{s % 60:02}s"
    return f"~{s}s"


def progress_line(tally: Tally, scope: Scope) -> str:
    """One plain line: the counts, the rates, and the time left at the budget's pace
    (each save costs at least one request of the budget; its other traffic is not known
    here, so this is the best case)."""
    s = tally.summary()
    finalized = tally.count(AttemptStatus.FINALIZED)
    left = scope.saves_left(tally)
    if scope.per_second is None:
        pace = "time left: unknown (no rate limit declared for the budget)"
    else:
        eta = duration(left / scope.per_second)
        pace = f"time left {eta} at the budget's pace ({scope.per_second:.1f} requests/s)"
    waiting = (
        ""
        if tally.paced_at is None
        else f"; admitting at the budget's pace ({tally.paced_at} in flight)"
    )
    return (
        f"push: admitted {s['admitted']}, finalized {finalized}, parked {s['parked']}, "
        f"rejected {s['rejected']}, skipped {tally.skipped_linked} linked + "
        f"{s['skipped_active_attempt']} active; "
        f"{tally.rate:.1f} admitted/s, {finalized / tally.elapsed_s:.1f} finalized/s; "
        f"{left} saves left, {pace}{waiting}"
    )


class ProgressLines:
    """Writes `progress_line` to `stream` at most once per `interval_s` (the first at once)."""

    def __init__(
        self,
        scope: Scope,
        interval_s: float = PROGRESS_INTERVAL_S,
        stream: Callable[[], TextIO] = lambda: sys.stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scope = scope
        self._interval_s = interval_s
        self._stream = stream
        self._clock = clock
        self._written_at: float | None = None

    def tick(self, tally: Tally) -> None:
        now = self._clock()
        if self._written_at is not None and now - self._written_at < self._interval_s:
            return
        self._written_at = now
        try:
            out = self._stream()
            out.write(progress_line(tally, self.scope) + "\n")
            out.flush()
        except (OSError, ValueError):  # stderr closed (a pipe's reader gone): admission goes on
            self._interval_s = float("inf")


async def scope_of(
    pool: asyncpg.Pool,
    owner_key: str,
    destination_slot: str,
    source_object: str,
    record_ids: list[str],
    limit: int | None,
) -> Scope:
    """The run's scope: its records and its destination's budget, across every active
    pack (a budget's rate is the slowest any profile spending it declares, PROF-3)."""
    from db import push as q
    from protocol.rate_limit import destination_budget
    from services.packs import active_manifests, get_active_pack

    async with pool.acquire() as conn:
        if record_ids:
            records = len(await q.live_record_ids(conn, source_object, record_ids))
        else:
            records = await q.count_live_records(conn, source_object)
        pack = await get_active_pack(conn, owner_key)
        manifests = await active_manifests(conn)
    budget = destination_budget(manifests, pack.manifest, destination_slot) if pack else None
    return Scope(records, limit, budget.per_second if budget else None)
