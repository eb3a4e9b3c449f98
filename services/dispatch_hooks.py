"""Test seams inside the create path (no-ops in production).

A fault-injection test subclasses `DispatchHooks` to stall one activity try
between its claim and its checkpoint, the window REC-1 fencing must cover.
"""

from __future__ import annotations

from datetime import UTC, datetime


class DispatchHooks:
    # How long a run waiting for a daily quota sleeps before it looks again; None: until
    # the quota's reset (one timer per wait). A test with a moved clock sets a second.
    quota_recheck_s: float | None = None

    def now(self) -> datetime:
        """The clock daily quotas count days by (NF-8); a test moves it."""
        return datetime.now(UTC)

    async def before_checkpoint(self, attempt_id: str) -> None:
        """Called after the claim committed: before the RemoteIOStartedAt CAS where the two
        are separate (profiles without replay-safe idempotency or a locator contract),
        otherwise just before the send."""

    async def after_answer(self, attempt_id: str) -> None:
        """Called when a create's POST was answered, before the answer is applied: the
        window in which a try that outlived its timeout learns what its POST did."""

    async def before_read_back(self, patch_id: str) -> None:
        """Called before a PATCH's read-back GET is gated and checkpointed (G-1): the
        window in which what the read depends on may change after the PATCH was sent."""
