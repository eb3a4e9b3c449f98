"""Timeouts whose ordering is a correctness rule (REC-1, G-7), kept together so it is
checked once.

Each remote request has ONE overall deadline (pool wait, connect, write and read
together, SPEC G-7): `request_deadline_s`, computed when the request is about to leave
(after any pacing wait) from the time its activity has left, so a request never
outlives the activity that must record its answer. Worker graceful shutdown > HTTP
timeout: a stopping worker lets an in-flight request finish instead of cancelling it
into an ambiguous outcome.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

# The profile's request timeout: no request runs longer, whatever time its activity has.
REMOTE_HTTP_TIMEOUT: Final = timedelta(seconds=10)
REMOTE_ACTIVITY_START_TO_CLOSE: Final = timedelta(seconds=30)
LOCAL_ACTIVITY_START_TO_CLOSE: Final = timedelta(seconds=15)
WORKER_GRACEFUL_SHUTDOWN: Final = timedelta(seconds=20)
# What a request leaves of its activity's time: the transaction that records the answer
# (and the activity's completion) must still fit before start-to-close (G-7).
REQUEST_DEADLINE_MARGIN: Final = timedelta(seconds=3)

assert REMOTE_HTTP_TIMEOUT + REQUEST_DEADLINE_MARGIN < REMOTE_ACTIVITY_START_TO_CLOSE
assert WORKER_GRACEFUL_SHUTDOWN > REMOTE_HTTP_TIMEOUT


def activity_time_left(start_to_close: timedelta, started: datetime, now: datetime) -> float:
    """Seconds of an activity try's start-to-close still ahead at `now` (its `started` time
    is the server's; a clock behind it counts nothing spent, one far ahead all of it)."""
    total = start_to_close.total_seconds()
    spent = min(max(0.0, (now - started).total_seconds()), total)
    return total - spent


def request_deadline_s(
    time_left_s: float | None, request_timeout: timedelta = REMOTE_HTTP_TIMEOUT
) -> float:
    """G-7: how long the next request may take in all, computed just before it leaves:
    min(the request timeout, the activity's time left - margin). Zero or less: it may not
    leave at all (it stays `not_sent`). `time_left_s` None: no activity bounds it."""
    limit = request_timeout.total_seconds()
    if time_left_s is None:
        return limit
    return min(limit, time_left_s - REQUEST_DEADLINE_MARGIN.total_seconds())
