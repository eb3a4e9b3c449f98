"""Closed name sets: non-retryable activity error types (SPEC §5.4) and reasons."""

from __future__ import annotations

from enum import StrEnum


class ActivityErrorType(StrEnum):
    """`ApplicationError.type` for every non-retryable failure (ARCH-4).

    Each marks a point where replaying would repeat an ambiguous remote effect or
    contradict durable state; the workflow records it, it never retries it.
    """

    AMBIGUOUS_REMOTE_EFFECT = "AmbiguousRemoteEffect"
    REMOTE_REJECTED = "RemoteRejected"
    GATE_FAILED = "GateFailed"
    SOURCE_DELETED = "SourceDeleted"
    STALE_REMOTE_LOCATOR = "StaleRemoteLocator"
    TRANSITION_CONFLICT = "TransitionConflict"
    LANE_NOT_CLAIMABLE = "LaneNotClaimable"


NON_RETRYABLE_ERROR_TYPES: frozenset[str] = frozenset(t.value for t in ActivityErrorType)


class RejectReason(StrEnum):
    """Why admission refused a save (GATE-1, PATCH-1, LANE-2): one closed set."""

    NO_TRUSTED_SLOT = "no_trusted_slot"
    STABLE_IDS_UNRESOLVED = "stable_ids_unresolved"
    PACK_NOT_SINGLE_ACTIVE = "pack_not_single_active"
    NO_AUTHORITY = "no_authority"
    RECORD_UNREADABLE = "record_unreadable"
    FIELD_UNREADABLE = "field_unreadable"
    REQUIRED_FIELD_MISSING = "required_field_missing"
    MAPPING_INVALID = "mapping_invalid"
    EMPTY_BODY = "empty_body"
    PATH_TEMPLATE_INVALID = "path_template_invalid"
    SOURCE_DELETED = "source_deleted"
    SOURCE_NOT_FOUND = "source_not_found"  # never existed in the store (a typo, another owner)
    NO_FINALIZED_LINK = "no_finalized_link"
    ACTIVE_ATTEMPT = "active_attempt"
    LINK_SUSPENDED = "link_suspended"
    LINK_RETIRED = "link_retired"
    UNSUPERSEDED_TERMINAL_ATTEMPT = "unsuperseded_terminal_attempt"
    LINEAGE_UNRESOLVED = "lineage_unresolved"
    # C-8: the action slot's createPath changed and is not validated yet.
    CREATE_PATH_UNVALIDATED = "create_path_unvalidated"
    PRIOR_OWNERSHIP_UNCERTAIN = "prior_ownership_uncertain"
    FREEZE_FAILED = "freeze_failed"
    DRIFT_FAIL_CLOSED = "drift_fail_closed"
    UPDATE_PATH_UNRENDERABLE = "update_path_unrenderable"
    ASSOCIATION_TARGET_MISSING = "association_target_missing"
    ASSOCIATION_VECTOR_INVALID = "association_vector_invalid"


class SuspendReason(StrEnum):
    """Why a finalized link moved to `suspended_drift`."""

    DRIFT = "drift"  # stored as `drift:<surface>` (see `drift_reason`)
    REMOTE_DELETED = "remote_deleted"
    REMOTE_CONFLICT = "remote_conflict"
    STALE_REMOTE_LOCATOR = "stale_remote_locator"


def drift_reason(surface: str) -> str:
    """The stored `suspend_reason` of a drift suspension: `drift:<surface>` (e.g. `drift:endpoint`),
    so an operator sees which surface to revalidate without opening the findings."""
    return f"{SuspendReason.DRIFT.value}:{surface}"


def is_drift_reason(reason: str | None) -> bool:
    """A drift suspension, whether stored before surfaces were named (`drift`) or after."""
    return reason is not None and reason.split(":", 1)[0] == SuspendReason.DRIFT.value


class MirrorStatus(StrEnum):
    """Outcome of the compatibility mirror writeback (POST-2, POST-3)."""

    PENDING = "pending"
    WRITTEN = "written"
    SKIPPED = "skipped"
    SKIPPED_SOURCE_DELETED = "skipped_source_deleted"
    BLOCKED_MIRROR_DRIFT = "blocked_mirror_drift"
