"""Timeouts whose ordering is a correctness rule (REC-1), kept together so it is checked once.

HTTP timeout < activity start-to-close timeout: an attempt never outlives its
own request. Worker graceful shutdown > HTTP timeout: a stopping worker lets an
in-flight request finish instead of cancelling it into an ambiguous outcome.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

REMOTE_HTTP_TIMEOUT: Final = timedelta(seconds=10)
REMOTE_ACTIVITY_START_TO_CLOSE: Final = timedelta(seconds=30)
LOCAL_ACTIVITY_START_TO_CLOSE: Final = timedelta(seconds=15)
WORKER_GRACEFUL_SHUTDOWN: Final = timedelta(seconds=20)

assert REMOTE_HTTP_TIMEOUT < REMOTE_ACTIVITY_START_TO_CLOSE
assert WORKER_GRACEFUL_SHUTDOWN > REMOTE_HTTP_TIMEOUT
