"""The `ParkReason` keyword, free of imports: `links find --park-reason` lists it in its
help, and the CLI builds its command tree without loading pydantic (a fast start).
`protocol.park` re-exports it with the rules that name a view's reason."""

from __future__ import annotations

from enum import StrEnum


class ParkReason(StrEnum):
    """The `ParkReason` keyword: one closed set an operator filters on."""

    AMBIGUOUS_REMOTE_EFFECT = "ambiguous_remote_effect"
    TERMINAL_FAILED = "terminal_failed"
    DRIFT = "drift"
    REMOTE_DELETED = "remote_deleted"
    REMOTE_CONFLICT = "remote_conflict"
    STALE_REMOTE_LOCATOR = "stale_remote_locator"
    PATCH_OUTCOME_UNKNOWN = "patch_outcome_unknown"
    PATCH_FAILED = "patch_failed"
