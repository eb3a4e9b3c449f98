"""Canonical remote ids (SPEC PROF-4, ID-4, S-6).

Every entry that stores a remote id (finalize, reconcile, backfill) passes it
through `check_remote_id` first, so ' 1002' can never sit beside '1002' as a
second owner of one remote object. The database refuses the same shapes with a
CHECK constraint (migration 0010); this module is what names the problem.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from protocol.identity import has_control_character

# What the CHECK constraint refuses too (ASCII whitespace and control characters);
# the Python rule is stricter: any Unicode whitespace, control or format character.
MAX_REMOTE_ID_LENGTH: Final = 512
# Path segments that address the collection or its parent, not an object (S-6): a PATCH
# to `.../contacts/..` would go to another URL than the object's.
DOT_SEGMENTS: Final = frozenset({".", ".."})


class RemoteIdError(ValueError):
    """A remote id that is not canonical; `canonical` is its stripped form, if any."""

    def __init__(self, message: str, canonical: str | None) -> None:
        super().__init__(message)
        self.canonical = canonical


_BAD_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def _canonical_form(raw: str) -> str | None:
    """`raw` stripped, without its control and format characters (named in errors)."""
    kept = (ch for ch in raw.strip() if unicodedata.category(ch) not in _BAD_CATEGORIES)
    return "".join(kept) or None


def check_remote_id(raw: str, pattern: str | None = None) -> str:
    """`raw` if canonical, else RemoteIdError naming why (and the stripped form)."""
    if not raw:
        raise RemoteIdError("remote id is empty", None)
    if len(raw) > MAX_REMOTE_ID_LENGTH:
        raise RemoteIdError(f"remote id is longer than {MAX_REMOTE_ID_LENGTH} characters", None)
    if raw.strip() in DOT_SEGMENTS:
        raise RemoteIdError(f"remote id {raw!r} is a path segment, not an object id", None)
    if raw != raw.strip():
        message = f"remote id {raw!r} has leading or trailing whitespace"
        raise RemoteIdError(message, _canonical_form(raw))
    if has_control_character(raw, _BAD_CATEGORIES):
        message = f"remote id {raw!r} contains control characters"
        raise RemoteIdError(message, _canonical_form(raw))
    if pattern is not None and re.fullmatch(pattern, raw) is None:
        raise RemoteIdError(f"remote id {raw!r} does not match the profile's pattern", None)
    return raw


def is_canonical(raw: str, pattern: str | None = None) -> bool:
    try:
        check_remote_id(raw, pattern)
    except RemoteIdError:
        return False
    return True
