"""P6's figures: the sustained rate over the middle of a run from the sandbox's log of
admitted requests, the 429 share from its refusals, and the busiest rolling window of
requests sent, as the remote counted them arriving, admitted or refused (NF-8')."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import asyncpg

from sandbox.front_door import GateReport

if TYPE_CHECKING:
    from bench.rate_bench import Setup

CONTACTS_PATH: Final = "/crm/v3/objects/contacts"
# Refusals that are not the remote's limits: the bench is broken if it sees any.
NOT_LIMITS: Final = frozenset({"INVALID_AUTHENTICATION", "LOCKED"})
SENT_POSTS: Final = """
SELECT extract(epoch FROM sending_at)::float8 FROM connector_send_journal
WHERE method = 'POST' ORDER BY sending_at
"""

SUSTAINED_SHARE: Final = 0.8  # the middle 80% of the creates


def busiest(times: Sequence[float], window: float) -> int:
    """The most requests in any rolling window of `window` seconds (times sorted)."""
    start, best = 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def sustained_rate(times: Sequence[float]) -> float:
    """Requests/s over the middle SUSTAINED_SHARE of the requests (times sorted)."""
    skip = round(len(times) * (1 - SUSTAINED_SHARE) / 2)
    first, last = skip, len(times) - 1 - skip
    if last <= first:
        return 0.0
    return (last - first) / (times[last] - times[first])


def first_window(times: Sequence[float], window: float) -> int:
    return sum(1 for t in times if t < times[0] + window) if times else 0


async def sent_posts(dsn: str) -> list[float]:
    """When each POST was claimed (the send journal's sending_at), sorted."""
    conn = await asyncpg.connect(dsn)
    try:
        return [float(row[0]) for row in await conn.fetch(SENT_POSTS)]
    finally:
        await conn.close()


def figures(
    setup: Setup,
    report: GateReport,
    sent: list[float],
    summary: dict[str, object],
    elapsed: float,
) -> dict[str, float]:
    broken = {k: v for k, v in report.refused.items() if k in NOT_LIMITS and v}
    if broken:
        raise RuntimeError(f"the sandbox refused requests for other reasons: {broken}")
    ours = [a for a in report.admitted if a.path.startswith(CONTACTS_PATH)]
    times = sorted(a.at for a in ours if a.method == "POST")
    applied = len(ours)
    throttled = sum(report.refused.values())
    # Every request that reached the remote: what a strict limiter counts (NF-8'). The
    # journal's sending_at is its claim's time, before the send window's turn (a bound
    # on the claims, not on the sends); shown beside it.
    arrived = sorted([a.at for a in ours] + report.refused_at)
    sustained = sustained_rate(times)
    reference = setup.limit or 1.0
    return {
        "creates_per_s": round(sustained, 2),
        "ratio": round(sustained / reference, 3),
        "429_share": round(throttled / max(1, throttled + applied), 4),
        "429s": throttled,
        "parked": float(summary["parked"]),  # type: ignore[arg-type]
        "finalized": float(summary["finalized"]),  # type: ignore[arg-type]
        "end_to_end_per_s": round(setup.n / elapsed, 2),
        "remote_span_per_s": round((len(times) - 1) / max(1e-6, times[-1] - times[0]), 2),
        "busiest_window": busiest(arrived, setup.window),
        "busiest_claimed_window": busiest(sent, setup.window),
        "busiest_admitted_window": busiest(times, setup.window),
        "busiest_1s": busiest(times, 1.0),
        "first_window": first_window(times, setup.window),
        "posts": len(times),
        "elapsed_s": round(elapsed, 1),
        "admitted_per_s": float(summary["admitted_per_s"]),  # type: ignore[arg-type]
        "wake_deferred": float(summary["wake_deferred"]),  # type: ignore[arg-type]
    }
