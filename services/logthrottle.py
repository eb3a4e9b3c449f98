"""Repeated warnings logged once per interval with a count, not once per occurrence.

Under load one cause (Temporal slow, Postgres down) repeats thousands of times a
minute; one line per interval saying how many keeps the log readable and cheap.
Here, in services, so the ingress, the save entry and the worker share one throttle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

INTERVAL_S: Final = 60.0


@dataclass
class _Tally:
    logged_at: float
    suppressed: int = 0


class ThrottledLog:
    """`warning(message, *args)`: the first occurrence of a (message, args) is logged at
    once; later ones within `interval_s` are counted and reported with the next line.
    `extra` (e.g. the link key) is not part of what repeats: the logged line carries
    the extra of the occurrence it was logged for."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._tallies: dict[tuple[object, ...], _Tally] = {}

    def warning(
        self, message: str, *args: object, extra: Mapping[str, object] | None = None
    ) -> None:
        key = (message, *args)
        now = self._clock()
        tally = self._tallies.get(key)
        if tally is not None and now - tally.logged_at < self._interval_s:
            tally.suppressed += 1
            return
        repeats = 1 + (tally.suppressed if tally is not None else 0)
        if len(self._tallies) > 1024:  # keys are bounded by the callers; this never churns
            self._tallies.clear()
        self._tallies[key] = _Tally(now)
        suffix = f" ({repeats} times in the last {self._interval_s:.0f} s)" if repeats > 1 else ""
        self._logger.warning(message + "%s", *args, suffix, extra=extra)
