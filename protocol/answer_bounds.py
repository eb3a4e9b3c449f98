"""Bounds on what a remote's answer may make us hold or do (SPEC S-6): its size, its JSON
nesting and the wait its `Retry-After` asks for. `services.remote` enforces them where
an answer enters the process, so nothing behind it meets an unbounded answer.

An answer over a bound is unusable, not refused by the remote: the request may have
had its effect, so the try counts as sent with no usable answer (fail closed).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Final

from protocol.outcome import parse_retry_after

# HubSpot's object answers are a few KiB; a batch of 100 stays well under this.
MAX_ANSWER_BYTES: Final = 1024 * 1024
# Remote object JSON nests a handful of levels; Python's parser recurses per level.
MAX_ANSWER_DEPTH: Final = 64

_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET: Final = re.compile(rb"[\[\]{}]")


def too_large(declared_length: str | None) -> bool:
    """A `Content-Length` over the cap: refuse before reading a byte of the body."""
    if declared_length is None or not declared_length.strip().isdigit():
        return False
    return len(declared_length.strip()) > 12 or int(declared_length) > MAX_ANSWER_BYTES


def nesting_exceeds(body: bytes, limit: int = MAX_ANSWER_DEPTH) -> bool:
    """JSON (or anything bracketed) nested deeper than `limit`, brackets inside strings
    ignored; a scan, so a deep body never reaches a recursive parser."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub(b"", body)):
        if bracket.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth = max(0, depth - 1)
    return False


def bounded_retry_after(value: str | None, now: datetime, cap_s: float) -> str | None:
    """The `Retry-After` to act on: as the remote sent it when it asks for at most
    `cap_s` seconds (or cannot be read: callers use their default), else `cap_s` as
    delta-seconds (`Retry-After: 86400000000` is not a million-day wait)."""
    wanted = parse_retry_after(value, now)
    if wanted is None or (math.isfinite(wanted) and wanted <= cap_s):
        return value
    return str(math.floor(cap_s))
