"""Rates read from the sandbox's log of admitted requests (P6): the sustained rate over the
middle of a run, and the busiest rolling window."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

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
