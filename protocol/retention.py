"""Retention (SPEC OPS-3) and the age arguments operators type (`30d`, `12h`).

What may be pruned is decided by the database guards (migrations 0041, 0170; G-3) and
the named queries in db/retention.py; this module holds the pure parts: parsing
an age, and the report a prune run returns.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from protocol.retention_defaults import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
from protocol.retention_defaults import DEFAULT_KEEP_PATCHES as DEFAULT_KEEP_PATCHES

_AGE: Final = re.compile(r"([1-9][0-9]{0,5})([smhdw])")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


# Longer ages mean nothing to retention or an audit query, and `now - age` must stay
# a datetime (999999w is past year 1: OverflowError).
MAX_AGE: Final = timedelta(days=36_500)


class AgeInvalid(ValueError):
    """An age argument that is not `<n><unit>`."""


class AgeTooLong(AgeInvalid):
    """An age argument of the right shape beyond `MAX_AGE`."""


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `2w`, `45s` as a timedelta of at most `MAX_AGE`; raises
    `AgeInvalid` otherwise."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise AgeInvalid(f"{text!r} is not an age like 30d, 12h, 90m, 2w or 45s")
    age = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if age > MAX_AGE:
        raise AgeTooLong(f"{text!r} is longer than {MAX_AGE.days}d (100 years)")
    return age


class PruneInput(BaseModel):
    """One prune run: what is old enough, how many PATCHes each link keeps, batch size."""

    model_config = ConfigDict(frozen=True)

    older_than_seconds: int = Field(ge=0)
    keep_patches_per_link: int = Field(default=DEFAULT_KEEP_PATCHES, ge=0)
    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1, le=100_000)
    dry_run: bool = False


class PruneCounts(BaseModel):
    """Rows deleted (or, in a dry run, that would be) per kind."""

    model_config = ConfigDict(frozen=True)

    ingress_receipts: int = 0
    events: int = 0
    patches: int = 0
    patch_journal: int = 0
    action_executions: int = 0
    # S-7: stored save answers (idempotency records) past the same age; a repeat of
    # such an Idempotency-Key is admitted afresh.
    save_answers: int = 0


class PruneReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    dry_run: bool
    older_than_seconds: int = Field(ge=0)
    keep_patches_per_link: int = Field(ge=0)
    counts: PruneCounts
