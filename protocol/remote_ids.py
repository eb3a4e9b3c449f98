"""Canonical remote ids (SPEC PROF-4, ID-4).

Every entry that stores a remote id (finalize, reconcile, backfill) passes it
through `check_remote_id` first, so ' 1002' can never sit beside '1002' as a
second owner of one remote object. The database refuses the same shapes with a
CHECK constraint (migration 0010); this module is what names the problem.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

# What the CHECK constraint refuses too (ASCII whitespace and control characters);
# the Python rule is stricter: any Unicode whitespace, control or format character.
MAX_REMOTE_ID_LENGTH: Final = 512


class RemoteIdError(ValueError):
    """A remote id that is not canonical; `canonical` is its stripped form, if any."""

    def __init__(self, message: str, canonical: str | None) -> None:
        super().__init__(message)
        self.canonical = canonical


def _bad_char(ch: str) -> bool:
    return unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co", "Cn"}


def check_remote_id(raw: str, pattern: str | None = None) -> str:
    """`raw` if canonical, else RemoteIdError naming why (and the stripped form)."""
    canonical = "".join(ch for ch in raw.strip() if not _bad_char(ch)) or None
    if not raw:
        raise RemoteIdError("remote id is empty", None)
    if len(raw) > MAX_REMOTE_ID_LENGTH:
        raise RemoteIdError(f"remote id is longer than {MAX_REMOTE_ID_LENGTH} characters", None)
    if raw != raw.strip():
        raise RemoteIdError(f"remote id {raw!r} has leading or trailing whitespace", canonical)
    if any(_bad_char(ch) for ch in raw):
        raise RemoteIdError(f"remote id {raw!r} contains control characters", canonical)
    if pattern is not None and re.fullmatch(pattern, raw) is None:
        raise RemoteIdError(f"remote id {raw!r} does not match the profile's pattern", None)
    return raw


def is_canonical(raw: str, pattern: str | None = None) -> bool:
    try:
        check_remote_id(raw, pattern)
    except RemoteIdError:
        return False
    return True
