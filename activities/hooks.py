"""Test seams inside the create path (no-ops in production).

A fault-injection test subclasses `DispatchHooks` to stall one activity try
between its claim and its checkpoint, the window REC-1 fencing must cover.
"""

from __future__ import annotations


class DispatchHooks:
    async def before_checkpoint(self, attempt_id: str) -> None:
        """Called after the claim committed: before the RemoteIOStartedAt CAS where the two
        are separate (profiles without replay-safe idempotency or a locator contract),
        otherwise just before the send."""

    async def after_answer(self, attempt_id: str) -> None:
        """Called when a create's POST was answered, before the answer is applied: the
        window in which a try that outlived its timeout learns what its POST did."""
